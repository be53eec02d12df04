package mx

import (
	"testing"
	"time"
)

// TestFDTimer: a set timer fires once, a later set replaces the pending
// expiry, a stopped one does not fire.
func TestFDTimer(t *testing.T) {
	fired := make(chan time.Time, 4)
	tm, err := newFDTimer(func() { fired <- time.Now() })
	if err != nil {
		t.Skip("no timerfd:", err)
	}
	defer tm.close()
	start := time.Now()
	tm.set(200 * time.Microsecond)
	select {
	case at := <-fired:
		if d := at.Sub(start); d < 200*time.Microsecond {
			t.Fatalf("fired after %v, before its 200 µs", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a timer set to 200 µs did not fire in 5 s")
	}
	tm.set(time.Hour)
	tm.set(time.Millisecond) // replaces the hour
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("a timer moved from an hour to 1 ms did not fire in 5 s")
	}
	tm.set(20 * time.Millisecond)
	tm.stop()
	select {
	case <-fired:
		t.Fatal("a stopped timer fired")
	case <-time.After(100 * time.Millisecond):
	}
}
