package logfmt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestJournalPriorities: every line starts with the "<N>" the journal
// files it under, and carries no time of its own.
func TestJournalPriorities(t *testing.T) {
	var b bytes.Buffer
	log, err := New(&b, slog.LevelDebug, "journal")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("d")
	log.Info("i", "k", 1)
	log.With("peer", "lyon").Warn("w")
	log.WithGroup("g").Error("e", "k", "v w")
	want := []string{
		`<7>level=DEBUG msg=d`,
		`<6>level=INFO msg=i k=1`,
		`<4>level=WARN msg=w peer=lyon`,
		`<3>level=ERROR msg=e g.k="v w"`,
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), b.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, got[i], want[i])
		}
	}
}

func TestFormats(t *testing.T) {
	var b bytes.Buffer
	log, err := New(&b, slog.LevelInfo, "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Warn("w", "n", 3)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil {
		t.Fatalf("json: %v: %s", err, b.String())
	}
	if rec["msg"] != "w" || rec["level"] != "WARN" || rec["n"] != 3.0 || rec["time"] == nil {
		t.Errorf("json record %v", rec)
	}
	b.Reset()
	log, _ = New(&b, slog.LevelInfo, "auto") // not a file: text
	log.Info("x")
	if !strings.HasPrefix(b.String(), "time=") {
		t.Errorf("auto on a buffer: %q, want text with time", b.String())
	}
	if _, err := New(&b, slog.LevelInfo, "syslog"); err == nil || !strings.Contains(err.Error(), `log format "syslog": want auto, text, json, journal`) {
		t.Errorf("bad format: %v", err)
	}
}

// TestUnderJournal: auto takes the journal format only for the very
// stream $JOURNAL_STREAM names.
func TestUnderJournal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	stream := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	if !UnderJournal(f, stream) {
		t.Errorf("%s is the file's own device and inode", stream)
	}
	for _, s := range []string{"", "x", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1), "1:2:3"} {
		if UnderJournal(f, s) {
			t.Errorf("JOURNAL_STREAM=%q taken as this file", s)
		}
	}
	t.Setenv("JOURNAL_STREAM", stream)
	log, err := New(f, slog.LevelInfo, "auto")
	if err != nil {
		t.Fatal(err)
	}
	log.Warn("w")
	b, _ := os.ReadFile(f.Name())
	if string(b) != "<4>level=WARN msg=w\n" {
		t.Errorf("auto under the journal wrote %q", b)
	}
}
