package relay

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// TestControlQueueLimit: a peer that floods PINGs and never reads makes
// the link queue PONGs; past MaxControl the link fails instead of growing.
// The pair is a net.Pipe, whose writes wait for the reader: over loopback
// TCP a peer that never reads and always writes could stall the kernel
// connection itself (its full receive queue drops the segments carrying
// the link's ACKs, and both ends back off their retransmission timers
// into tens of seconds, with the link's reader waiting for bytes).
func TestControlQueueLimit(t *testing.T) {
	evil, c := net.Pipe()
	defer evil.Close()
	var mu sync.Mutex
	var reasons []string
	// A pipe is no kernel socket: the link reads it without the poller.
	cfg := Config{PingInterval: time.Hour, MaxControl: 1000, NoPoller: true,
		Limited: func(reason, peer string, err error) {
			mu.Lock()
			reasons = append(reasons, reason+" "+peer)
			mu.Unlock()
		}}
	ph := header.Hello{SiteID: 9, LinkCount: 1, MaxPayload: header.MaxPayload, Window: 1 << 16, Name: "evil"}
	l := NewLink(c, cfg, ph, false, nil)
	defer l.Close()
	var pings []byte
	for range 1000 {
		pings = header.AppendFrame(pings, header.TypePing, 0, make([]byte, 8))
	}
	go func() {
		for {
			if _, err := evil.Write(pings); err != nil {
				return
			}
		}
	}()
	select {
	case <-l.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("link still up after 20 s of PINGs never read; %d frames received", l.Stats.FramesRecv.Load())
	}
	if err := l.Err(); err == nil || !strings.Contains(err.Error(), "control frames unread (limit 1000)") {
		t.Fatalf("link error %v, want the control queue limit", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != 1 || reasons[0] != "control_queue evil" {
		t.Fatalf("limits reported: %q, want one control_queue of peer evil", reasons)
	}
}

// TestEarlyDataLimit: DATA for streams whose destination is not connected
// yet shares the trunk's MaxEarly; the stream that would pass it is reset
// with code 10 (limit), the link and the other streams live on.
func TestEarlyDataLimit(t *testing.T) {
	cfg := Config{Window: 256 << 10, MaxEarly: 300 << 10}
	ca, cb, ha, hb := handshaken(t, &cfg, 0, 1, 0)
	var mu sync.Mutex
	var held []*Stream
	var limits int
	bcfg := cfg
	bcfg.Limited = func(reason, peer string, err error) {
		mu.Lock()
		if reason == "early_data" {
			limits++
		}
		mu.Unlock()
	}
	a := NewLink(ca, cfg, ha, true, nil)
	// b never connects the destinations: every byte stays early.
	b := NewLink(cb, bcfg, hb, false, HandlerFunc(func(s *Stream, o *header.Open) {
		mu.Lock()
		held = append(held, s)
		mu.Unlock()
	}))
	t.Cleanup(func() { a.Close(); b.Close() })
	var apps []*net.TCPConn
	var streams []*Stream
	for range 3 {
		app, s := openVia(t, a, netip.MustParseAddrPort("127.0.0.1:9"))
		defer app.Close()
		apps = append(apps, app)
		streams = append(streams, s)
		app.Write(make([]byte, 200<<10)) // within the window, 600 KiB in all
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := limits
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream reset; %d early bytes buffered (limit %d)", b.t.EarlyBytes(), cfg.MaxEarly)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := b.t.EarlyBytes(); e > cfg.MaxEarly {
		t.Fatalf("%d early bytes buffered, limit %d", e, cfg.MaxEarly)
	}
	reset := 0
	for _, s := range streams {
		select {
		case <-s.Done():
			if s.Code() != header.CodeLimit {
				t.Errorf("stream %d ended with %v, want %v", s.ID(), s.Code(), header.CodeLimit)
			}
			reset++
		case <-time.After(2 * time.Second):
		}
	}
	if reset == 0 || reset == 3 {
		t.Fatalf("%d of 3 streams reset, want those past the limit only", reset)
	}
	select {
	case <-b.Done():
		t.Fatalf("link failed: %v", b.Err())
	default:
	}
	// Ending the held streams returns their early bytes.
	mu.Lock()
	for _, s := range held {
		s.Refuse(header.CodeRefused)
	}
	mu.Unlock()
	if e := b.t.EarlyBytes(); e != 0 {
		t.Fatalf("%d early bytes counted after every stream ended", e)
	}
}

// TestBeyondWindow: DATA past the window granted to the peer, before the
// destination has even been connected, is a protocol violation that
// fails the link (so early data per stream never exceeds Window).
func TestBeyondWindow(t *testing.T) {
	evil, c := tcpPair(t)
	defer evil.Close()
	cfg := Config{PingInterval: time.Hour, Window: 64 << 10}
	ph := header.Hello{SiteID: 9, LinkCount: 1, MaxPayload: header.MaxPayload, Window: 1 << 16, Name: "evil"}
	// The stream is held, never connected: its DATA waits in the window.
	l := NewLink(c, cfg, ph, false, HandlerFunc(func(s *Stream, o *header.Open) {}))
	defer l.Close()
	body, _ := header.AppendOpen(nil, &header.Open{Dst: netip.MustParseAddrPort("10.0.0.1:1"), Src: netip.MustParseAddrPort("10.0.0.2:2")})
	in := header.AppendFrame(nil, header.TypeOpen, 1, body)
	for range 5 { // 80 KiB into a 64 KiB window
		in = header.AppendFrame(in, header.TypeData, 1, make([]byte, 16<<10))
	}
	go evil.Write(in)
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("link still up after DATA beyond the window")
	}
	if err := l.Err(); err == nil || !strings.Contains(err.Error(), "beyond its window") {
		t.Fatalf("link error %v, want DATA beyond the window", err)
	}
}
