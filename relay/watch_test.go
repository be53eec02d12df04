package relay

import (
	"testing"
	"time"
)

// TestWatchSend: a watch fires once, on the first frame sent after it was
// armed (inline path and writer alike), a later watch replaces an earlier
// one in its slot, and the slots fire independently.
func TestWatchSend(t *testing.T) {
	// No keepalives during the test: they are frames too.
	a, app, _, data := sumStream(t, Config{Chunk: 16 << 10, PingInterval: time.Hour}, 256<<10)
	sentUpTo := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for a.Stats.BytesSent.Load() < uint64(n) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d bytes sent", a.Stats.BytesSent.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	fired := func(c chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	write := func(from, to int) {
		t.Helper()
		if _, err := app.Write(data[from:to]); err != nil {
			t.Fatal(err)
		}
		sentUpTo(to)
	}
	write(0, 100) // the stream is confirmed
	time.Sleep(20 * time.Millisecond)

	c := make(chan struct{}, 1)
	a.WatchSend(0, c)
	time.Sleep(20 * time.Millisecond)
	if fired(c) {
		t.Fatal("the watch fired while the link sent nothing")
	}
	write(100, 110) // small: the inline path
	if !fired(c) {
		t.Fatal("the watch did not fire on the next frame")
	}
	write(110, 120)
	if fired(c) {
		t.Fatal("the watch fired twice")
	}

	// The slots are independent: both fire on one frame.
	s0, s1 := make(chan struct{}, 1), make(chan struct{}, 1)
	a.WatchSend(0, s0)
	a.WatchSend(1, s1)
	write(120, 130)
	if f0, f1 := fired(s0), fired(s1); !f0 || !f1 {
		t.Fatalf("one frame fired slot 0 %v and slot 1 %v, want both", f0, f1)
	}

	old, c2 := make(chan struct{}, 1), make(chan struct{}, 1)
	a.WatchSend(0, old)
	a.WatchSend(0, c2)
	write(130, len(data)) // bulk: the writer
	if o, n := fired(old), fired(c2); o || !n {
		t.Fatalf("replaced watch fired %v, its replacement %v; want false, true", o, n)
	}
	wantSum(t, app, data)
}

// TestWatchSendIgnoresKeepalives: PINGs and PONGs do not fire a watch, so a
// sampler sleeping on an idle link is not woken every keepalive period.
func TestWatchSendIgnoresKeepalives(t *testing.T) {
	a, app, _, data := sumStream(t, Config{PingInterval: 10 * time.Millisecond}, 1000)
	if _, err := app.Write(data); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats.BytesSent.Load() < uint64(len(data)) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d bytes sent", a.Stats.BytesSent.Load(), len(data))
		}
		time.Sleep(time.Millisecond)
	}
	c := make(chan struct{}, 1)
	a.WatchSend(0, c)
	frames := a.Stats.FramesSent.Load()
	time.Sleep(200 * time.Millisecond)
	if n := a.Stats.FramesSent.Load() - frames; n < 5 {
		t.Fatalf("%d frames sent in 200 ms with keepalives every 10 ms; want PINGs", n)
	}
	select {
	case <-c:
		t.Fatal("a keepalive fired the watch")
	default:
	}
	wantSum(t, app, data)
}
