package mx

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleStreamsHoldNothing: open streams that carry nothing hold no
// goroutine and no receive buffer at either end; a byte written on each
// afterwards arrives (through TryRead and NotifyReadable at one end,
// Read at the other), and once both ends close no receive stays posted.
func TestIdleStreamsHoldNothing(t *testing.T) {
	_, _, _, a, b := pair(t, nil, Config{})
	ctx := ctx10(t)
	cfg := StreamConfig{Chunk: 16 << 10, Window: 64 << 10, RecvAhead: 2}
	ln, _ := Listen(b, cfg)
	const n = 300
	g0 := runtime.NumGoroutine()
	ds, ss := make([]*Stream, n), make([]*Stream, n)
	for i := range n {
		d, err := Dial(ctx, a, b.Addr(), []byte{byte(i)}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ds[i], ss[i] = d, s
	}
	if g := runtime.NumGoroutine() - g0; g > n/10 {
		t.Errorf("%d idle streams (both ends) hold %d more goroutines", n, g)
	}
	for _, ep := range []*Endpoint{a, b} {
		ep.e.mu.Lock()
		posted, withBuf := ep.postedCount(), 0
		for _, byMatch := range ep.exact {
			for _, l := range byMatch {
				for _, r := range l {
					if r.buf != nil {
						withBuf++
					}
				}
			}
		}
		ep.e.mu.Unlock()
		if posted != n*cfg.RecvAhead || withBuf != 0 {
			t.Errorf("endpoint %v: %d receives posted, want %d; %d hold a buffer, want 0", ep.Addr(), posted, n*cfg.RecvAhead, withBuf)
		}
	}

	var fired atomic.Int64
	for _, s := range ss {
		s.NotifyReadable(func() { fired.Add(1) })
	}
	for i, d := range ds {
		if _, err := d.Write([]byte{byte(i), 'x'}); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range ss {
		var got []byte
		buf := make([]byte, 8)
		for deadline := time.Now().Add(10 * time.Second); len(got) < 2; {
			k, err := s.TryRead(buf)
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
			got = append(got, buf[:k]...)
			if k == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("stream %d: TryRead found %q after 10 s", i, got)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if !bytes.Equal(got, []byte{byte(i), 'x'}) {
			t.Fatalf("stream %d read %q", i, got)
		}
		if s.Readable() {
			t.Fatalf("stream %d readable with nothing more sent", i)
		}
	}
	if f := fired.Load(); f < n {
		t.Errorf("NotifyReadable fired %d times for %d streams that each got a message", f, n)
	}
	for i, s := range ss {
		s.Write([]byte{'y'})
		buf := make([]byte, 1)
		if _, err := ds[i].Read(buf); err != nil || buf[0] != 'y' {
			t.Fatalf("stream %d answer: %q %v", i, buf, err)
		}
	}
	for i := range n {
		ds[i].Close()
		ss[i].Close()
	}
	for i := range n {
		<-ds[i].recvDone
		<-ss[i].recvDone
	}
	nonePosted(t, "after every stream closed", a, b)
}

// nonePosted fails t if a receive waits at any of eps.
func nonePosted(t *testing.T, when string, eps ...*Endpoint) {
	t.Helper()
	for _, ep := range eps {
		ep.e.mu.Lock()
		k := ep.postedCount()
		ep.e.mu.Unlock()
		if k != 0 {
			t.Errorf("endpoint %v: %d receives posted %s", ep.Addr(), k, when)
		}
	}
}

// TestPostedOrderAcrossIndex: a message takes the first posted receive
// that matches it, whether that one waits in the index of exact receives
// or among the others.
func TestPostedOrderAcrossIndex(t *testing.T) {
	_, _, _, a, b := pair(t, nil, Config{})
	ctx := ctx10(t)
	if err := a.Connect(ctx, b.Addr()); err != nil {
		t.Fatal(err)
	}
	const m = 0x1234_5600
	from := a.Addr()
	wild := b.Irecv(make([]byte, 8), m, ^uint64(0xffff)) // posted first, matches too
	exact := b.IrecvFrom(from, make([]byte, 8), m, exactMask)
	if err := a.Send(ctx, b.Addr(), m|7, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if n, match, _, err := wild.Status(); err != nil || n != 3 || match != m|7 {
		t.Fatalf("the receive posted first got %d bytes, match %#x, %v", n, match, err)
	}
	wild2 := b.Irecv(make([]byte, 8), m, ^uint64(0xffff)) // posted after exact
	if err := a.Send(ctx, b.Addr(), m|9, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if n, match, _, err := exact.Status(); err != nil || n != 3 || match != m|9 {
		t.Fatalf("the exact receive got %d bytes, match %#x, %v", n, match, err)
	}
	if !b.Cancel(wild2) {
		t.Fatal("the later wildcard receive was taken")
	}
	if b.Cancel(exact) {
		t.Fatal("a done receive canceled")
	}
}
