package relay

import (
	"testing"
	"time"
)

// TestHold: while a link is held nothing reaches its socket, neither a
// bulk write (queued for the writer) nor a small one (inline path); when
// the hold ends every byte goes out in order.
func TestHold(t *testing.T) {
	a, app, _, data := sumStream(t, Config{Chunk: 16 << 10, Window: 256 << 10}, 1<<20+13)
	// The first part goes out unheld (the stream is confirmed).
	first := 64 << 10
	if _, err := app.Write(data[:first]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats.BytesSent.Load() < uint64(first) {
		if time.Now().After(deadline) {
			t.Fatalf("first %d bytes not sent: %d", first, a.Stats.BytesSent.Load())
		}
		time.Sleep(time.Millisecond)
	}
	const hold = MaxHold * 9 / 10
	start := time.Now()
	a.Hold(start.Add(hold))
	sent := a.Stats.BytesSent.Load()
	if _, err := app.Write(data[first : first+10]); err != nil { // small: inline path
		t.Fatal(err)
	}
	go app.Write(data[first+10:]) // bulk: blocks once the window is used
	time.Sleep(hold / 3)
	if el := time.Since(start); el < hold {
		if got := a.Stats.BytesSent.Load(); got != sent {
			t.Fatalf("%v into a %v hold the link sent %d bytes", el, hold, got-sent)
		}
		if !a.held() {
			t.Fatalf("%v into a %v hold the link is not held", el, hold)
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for a.Stats.BytesSent.Load() < uint64(len(data)) {
		if time.Now().After(deadline) {
			t.Fatalf("after the hold only %d of %d bytes sent", a.Stats.BytesSent.Load(), len(data))
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(start); el < hold {
		t.Fatalf("all bytes sent %v into a %v hold", el, hold)
	}
	wantSum(t, app, data)

	// A hold is cut to MaxHold, so the link's keepalives keep it alive.
	a.Hold(time.Now().Add(time.Hour))
	if d := a.holdLeft(); d <= 0 || d > MaxHold {
		t.Errorf("an hour's hold runs %v, want at most %v", d, MaxHold)
	}
	a.Hold(time.Now())
}
