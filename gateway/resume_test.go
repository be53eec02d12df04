package gateway

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// resetConn resets a WAN link's connection from this side, as `ss -K` or
// a middlebox does: both gateways see it fail.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
		tc.Close()
	}
}

// breakLinks resets a WAN connection of gateway a or b every 20-60 ms
// (drawn from seed) until the returned function is called, which returns
// how many it reset.
func breakLinks(a, b *testGW, seed uint64) (stop func() int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var kills int
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, seed+1))
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Duration(20+r.IntN(40)) * time.Millisecond):
			}
			g := a
			if r.IntN(2) == 1 {
				g = b
			}
			ls := g.allLinks()
			if l := ls[r.IntN(len(ls))]; !l.Down() {
				resetConn(l.Conn())
				kills++
			}
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		return kills
	}
}

// TestWANResume: 1000 checksummed streams cross the gateway pair while WAN
// connections (bulk and express, either side) are reset every 20-60 ms.
// Every link resumes on a new connection; no stream sees an error, no byte
// is lost or repeated.
func TestWANResume(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.WANConns = 2 })
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	maxSize := 2 << 20
	if raceEnabled {
		maxSize = 256 << 10
	}
	stop := breakLinks(a, b, 11)
	const n = 1000
	start := time.Now()
	total := sumStreams(t, a, dst, n, maxSize, 43)
	kills := stop()
	resumes := counter(t, a, "mpi5k_wan_resumes_total") + counter(t, b, "mpi5k_wan_resumes_total")
	t.Logf("%d streams, %d bytes in %v; %d connections reset, %v resumes counted by the two gateways",
		n, total, time.Since(start).Round(time.Millisecond), kills, resumes)
	if kills < 5 {
		t.Fatalf("only %d resets: the test did not break the links", kills)
	}
	if resumes < float64(kills) {
		t.Fatalf("%v resumes for %d resets", resumes, kills)
	}
	for _, g := range []*testGW{a, b} {
		if n := len(g.allLinks()); n != g.mine.numLinks() {
			t.Fatalf("%d links up after the test, want %d", n, g.mine.numLinks())
		}
	}
}
