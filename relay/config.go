package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// Config tunes a link. The zero value of a field means its default
// (DefaultConfig); NewLink and Trunk.Add fill zero fields from it and then
// call Validate, and panic on a Config it rejects: a link cannot refuse
// the connection its handshake has accepted, so its caller validates the
// configuration once, at start, as gateway.New does.
type Config struct {
	Chunk      int    // largest DATA payload sent (default 128 KiB, clamped to the peer's max payload)
	Window     uint32 // credit granted to the peer on every new stream (default 1 MiB)
	SmallFrame int    // DATA up to this many bytes is scheduled ahead of bulk (default 16 KiB)
	ExpressMax int    // largest burst a trunk's express link takes (default SmallFrame; see Trunk)
	// NoStripe keeps a stream's DATA that does not take the express link
	// on its home link while that link is up, as the stream's own TCP
	// connection would carry it, instead of striping it over the trunk's
	// bulk links.
	NoStripe bool
	MaxBatch int // most frames per writev (default 64)
	// Pipeline is how many chunks of one stream may wait for the link
	// writer (default 2): with two, a stream reads chunk B from its
	// application while the writer sends chunk A (double buffering), and no
	// stream can hog the writer's queue.
	Pipeline     int
	PingInterval time.Duration // keepalive period of a busy link (default 1 s); idle links: keep.go
	DeadAfter    time.Duration // a link silent this long is dead (default 4 × PingInterval)
	Logger       *slog.Logger
	// NoPoller keeps idle sockets in Go's network poller instead of the
	// relay's poller thread (see poller.go); for measuring the difference.
	NoPoller bool
	// RuntimeWakes leaves Go's runtime watching the input of sockets the
	// poller thread owns, so each arriving byte also wakes a runtime
	// thread (rtquiet.go); for measuring the difference.
	RuntimeWakes bool
	// QueueControl turns on queue control (queue.go) on bulk links whose
	// peer applies CLAMP frames: it makes each trunk's controller
	// (tuning.QueueControl). Nil: off.
	QueueControl func() QueueController
	// ExpressControl decides when a trunk's express link is renewed and
	// when it is held aside (express.go): it makes each trunk's controller
	// (tuning.ExpressControl), which Trunk.StepExpress runs. Nil: neither.
	ExpressControl func() ExpressController
	// MaxControl is the most control frames (PONG, WINDOW, OPEN_REFUSED,
	// ...) that may wait unsent on the link (default 65536: 88 bytes
	// each, at most 11 MiB while the queue grows). A peer that sends
	// requests and does not read the replies would grow the queue without
	// bound: past the limit the link fails. The default stays above the
	// frames a burst of stream setups (OPEN, OPEN_OK, ...) queues while the
	// WAN stalls for a few seconds, which the stream limits bound.
	MaxControl int
	// MaxEarly is the most DATA bytes a trunk buffers for streams whose
	// destination is not connected yet (default 64 MiB). Each stream's
	// window bounds its own; past the trunk's limit the stream whose DATA
	// overflows it is reset (code 10, limit).
	MaxEarly int64
	// Limited, if set, is told of every limit a peer hits (reason
	// "control_queue" or "early_data"), so the gateway can count and log
	// it; else the link logs a warning. It may run on the poller thread:
	// it must not block.
	Limited func(reason string, peer string, err error)
	// ReplayMax is how many bytes of bulk a resuming link keeps for the
	// peer's ACK (default 16 MiB); the writer waits past it. It bounds
	// the link's rate to ReplayMax per round trip: keep it above the
	// path's bandwidth-delay product.
	ReplayMax int64
	// ResumeWithin is how long a resuming link may stay down before it
	// fails and its streams are reset (default 60 s).
	ResumeWithin time.Duration
}

// DefaultConfig returns the defaults Config's fields document. DeadAfter
// is 4 × PingInterval and ExpressMax is SmallFrame, here as in a Config
// that sets PingInterval or SmallFrame and leaves them zero.
func DefaultConfig() Config {
	return Config{
		Chunk:        128 << 10,
		Window:       1 << 20,
		SmallFrame:   16 << 10,
		ExpressMax:   16 << 10,
		MaxBatch:     64,
		Pipeline:     2,
		PingInterval: time.Second,
		DeadAfter:    4 * time.Second,
		MaxControl:   1 << 16,
		MaxEarly:     64 << 20,
		ReplayMax:    16 << 20,
		ResumeWithin: time.Minute,
	}
}

// fillDefaults gives zero fields their defaults (DefaultConfig), those
// that follow another field from that field's value.
func (c *Config) fillDefaults() {
	d := DefaultConfig()
	c.Chunk = cmp.Or(c.Chunk, d.Chunk)
	c.Window = cmp.Or(c.Window, d.Window)
	c.SmallFrame = cmp.Or(c.SmallFrame, d.SmallFrame)
	c.ExpressMax = cmp.Or(c.ExpressMax, c.SmallFrame)
	c.MaxBatch = cmp.Or(c.MaxBatch, d.MaxBatch)
	c.Pipeline = cmp.Or(c.Pipeline, d.Pipeline)
	c.PingInterval = cmp.Or(c.PingInterval, d.PingInterval)
	c.DeadAfter = cmp.Or(c.DeadAfter, 4*c.PingInterval)
	c.MaxControl = cmp.Or(c.MaxControl, d.MaxControl)
	c.MaxEarly = cmp.Or(c.MaxEarly, d.MaxEarly)
	c.ReplayMax = cmp.Or(c.ReplayMax, d.ReplayMax)
	c.ResumeWithin = cmp.Or(c.ResumeWithin, d.ResumeWithin)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first field out of range, zero fields standing for
// their defaults.
func (c *Config) Validate() error {
	v := *c
	v.fillDefaults()
	if v.Chunk < 0 || v.Chunk > header.MaxPayload {
		return fmt.Errorf("relay: Chunk %d out of range 1..%d (the largest DATA payload; 0 takes the default, %d)", v.Chunk, header.MaxPayload, DefaultConfig().Chunk)
	}
	for _, f := range []struct {
		name string
		neg  bool
		v    any
	}{{"SmallFrame", v.SmallFrame < 0, v.SmallFrame}, {"ExpressMax", v.ExpressMax < 0, v.ExpressMax},
		{"MaxBatch", v.MaxBatch < 0, v.MaxBatch}, {"Pipeline", v.Pipeline < 0, v.Pipeline},
		{"PingInterval", v.PingInterval < 0, v.PingInterval}, {"DeadAfter", v.DeadAfter < 0, v.DeadAfter},
		{"MaxControl", v.MaxControl < 0, v.MaxControl}, {"MaxEarly", v.MaxEarly < 0, v.MaxEarly},
		{"ReplayMax", v.ReplayMax < 0, v.ReplayMax}, {"ResumeWithin", v.ResumeWithin < 0, v.ResumeWithin}} {
		if f.neg {
			return fmt.Errorf("relay: %s %v is negative: give a positive value, or 0 for its default (DefaultConfig)", f.name, f.v)
		}
	}
	return nil
}

// Hello returns the HELLO a side with this configuration sends.
func (c Config) Hello(site uint8, name string, index, count uint8) header.Hello {
	c.fillDefaults()
	return header.Hello{SiteID: site, LinkIndex: index, LinkCount: count,
		MaxPayload: header.MaxPayload, Window: c.Window, Name: name}
}

// Answer reads the peer's HELLO first and then sends the one reply makes
// of it, both before ctx's deadline: the accepting side of a WAN link,
// whose answer to a resuming HELLO depends on the link it names. When
// reply fails nothing is sent and its error is returned.
func Answer(ctx context.Context, conn net.Conn, reply func(peer header.Hello) (header.Hello, error)) (header.Hello, error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	peer, err := readHello(conn)
	if err != nil {
		return peer, fmt.Errorf("relay: hello from %v: %w", conn.RemoteAddr(), err)
	}
	local, err := reply(peer)
	if err != nil {
		return peer, err
	}
	body, err := header.AppendHello(nil, &local)
	if err == nil {
		_, err = conn.Write(header.AppendFrame(nil, header.TypeHello, 0, body))
	}
	if err != nil {
		return peer, fmt.Errorf("relay: hello to %v: %w", conn.RemoteAddr(), err)
	}
	return peer, nil
}

// readHello reads the peer's HELLO, with no read-ahead: the link's Reader
// takes over the connection afterwards.
func readHello(conn net.Conn) (header.Hello, error) {
	h, p, err := header.ReadOne(conn, header.MaxControl)
	if err == nil && h.Type != header.TypeHello {
		err = fmt.Errorf("relay: first frame is %v, want HELLO", h.Type)
	}
	if err != nil {
		return header.Hello{}, err
	}
	return header.ParseHello(p)
}

// Handshake sends our HELLO and reads the peer's, both before ctx's
// deadline. The caller checks the peer's identity before NewLink.
func Handshake(ctx context.Context, conn net.Conn, local header.Hello) (header.Hello, error) {
	body, err := header.AppendHello(nil, &local)
	if err != nil {
		return header.Hello{}, err
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	errc := make(chan error, 1)
	go func() { _, err := conn.Write(header.AppendFrame(nil, header.TypeHello, 0, body)); errc <- err }()
	peer, err := readHello(conn)
	if werr := <-errc; err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return peer, fmt.Errorf("relay: hello with %v: %w", conn.RemoteAddr(), err)
	}
	return peer, nil
}
