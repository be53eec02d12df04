package gateway

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/tuning"
)

// TestGuardSleepsWhileQuiet: with no bulk link busy the guard does not
// sample every 5 ms (its busy period), and a bulk link's next frame wakes it at once.
// The idle period is an hour here, so only the wake-up can bring the busy
// sample.
func TestGuardSleepsWhileQuiet(t *testing.T) {
	if err := tuning.CheckCC("bbr"); err != nil {
		t.Skip(err)
	}
	_, a, _ := startPair(t, nil)
	a.guard.SetIdleEvery(time.Hour)
	counts := a.guard.Samples
	// Ready waits for priming; let its last flight be acknowledged.
	deadline := time.Now().Add(10 * time.Second)
	for {
		t0, b0 := counts()
		time.Sleep(300 * time.Millisecond)
		t1, b1 := counts()
		if b1 == b0 {
			if n := t1 - t0; n > 10 {
				t.Fatalf("the guard sampled %d times in 300 ms with every link quiet", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bulk links stayed busy for 10 s after priming (%d busy samples in the last 300 ms)", b1-b0)
		}
	}

	sink := testnet.Serve(t, nodeB, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	app, err := lanOpen(a.LANAddr(), nodeA, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	_, b0 := counts()
	buf := make([]byte, 1<<20)
	for i := 0; ; i++ {
		if _, err := app.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, b := counts(); b > b0 {
			break
		}
		if i == 256 {
			t.Fatal("256 MiB of bulk through the pair and the guard never sampled a busy link")
		}
	}
}
