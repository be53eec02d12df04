// Package logfmt makes the slog loggers of mpi5k's commands: text for a
// terminal, JSON on request, and under systemd lines the journal reads
// with their priority and without a second time stamp.
package logfmt

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Formats names the values of --log-format.
var Formats = []string{"auto", "text", "json", "journal"}

// New returns a logger writing records of level and above to w in format
// (one of Formats). auto is journal when w is the stream systemd's journal
// handed the process ($JOURNAL_STREAM names its device and inode), text
// otherwise.
func New(w io.Writer, level slog.Level, format string) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	if format == "auto" {
		format = "text"
		if f, ok := w.(*os.File); ok && UnderJournal(f, os.Getenv("JOURNAL_STREAM")) {
			format = "journal"
		}
	}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "journal":
		return slog.New(NewJournalHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want %s", format, strings.Join(Formats, ", "))
}

// UnderJournal reports whether f is the journal's stream: systemd sets
// JOURNAL_STREAM to "DEVICE:INODE" of the socket it connected to the
// service's stdout and stderr, and a redirected stderr no longer matches.
func UnderJournal(f *os.File, stream string) bool {
	dev, ino, ok := strings.Cut(stream, ":")
	if !ok {
		return false
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return false
	}
	d, err1 := strconv.ParseUint(dev, 10, 64)
	i, err2 := strconv.ParseUint(ino, 10, 64)
	return err1 == nil && err2 == nil && d == uint64(st.Dev) && i == st.Ino
}

// Priority is the syslog priority the journal files a level under: it
// reads a "<N>" at the start of each line (sd-daemon(3)), so
// `journalctl -p warning` finds warnings.
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3 // err
	case l >= slog.LevelWarn:
		return 4 // warning
	case l >= slog.LevelInfo:
		return 6 // info
	}
	return 7 // debug
}

// JournalHandler writes slog's text format without the time (the journal
// stamps each line itself), each line led by its "<N>" priority.
type JournalHandler struct {
	out   *journalOut
	inner slog.Handler // writes into out.buf
}

type journalOut struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
}

// NewJournalHandler returns a JournalHandler writing to w.
func NewJournalHandler(w io.Writer, opts *slog.HandlerOptions) *JournalHandler {
	o := *opts
	prev := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if prev != nil {
			return prev(groups, a)
		}
		return a
	}
	out := &journalOut{w: w}
	return &JournalHandler{out: out, inner: slog.NewTextHandler(&out.buf, &o)}
}

func (h *JournalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *JournalHandler) Handle(ctx context.Context, r slog.Record) error {
	o := h.out
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Reset()
	fmt.Fprintf(&o.buf, "<%d>", Priority(r.Level))
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	_, err := o.w.Write(o.buf.Bytes())
	return err
}

func (h *JournalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &JournalHandler{out: h.out, inner: h.inner.WithAttrs(as)}
}

func (h *JournalHandler) WithGroup(name string) slog.Handler {
	return &JournalHandler{out: h.out, inner: h.inner.WithGroup(name)}
}
