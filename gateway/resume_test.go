package gateway

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
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
	stop := make(chan struct{})
	var kills atomic.Int64
	var kwg sync.WaitGroup
	kwg.Add(1)
	go func() {
		defer kwg.Done()
		r := rand.New(rand.NewPCG(11, 12))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+r.IntN(40)) * time.Millisecond):
			}
			g := a
			if r.IntN(2) == 1 {
				g = b
			}
			ls := g.allLinks()
			l := ls[r.IntN(len(ls))]
			if l.Down() {
				continue
			}
			resetConn(l.Conn())
			kills.Add(1)
		}
	}()
	const n = 1000
	start := time.Now()
	total := sumStreams(t, a, dst, n, maxSize, 43)
	close(stop)
	kwg.Wait()
	resumes := counter(t, a, "mpi5k_wan_resumes_total") + counter(t, b, "mpi5k_wan_resumes_total")
	t.Logf("%d streams, %d bytes in %v; %d connections reset, %v resumes counted by the two gateways",
		n, total, time.Since(start).Round(time.Millisecond), kills.Load(), resumes)
	if kills.Load() < 5 {
		t.Fatalf("only %d resets: the test did not break the links", kills.Load())
	}
	if resumes < float64(kills.Load()) {
		t.Fatalf("%v resumes for %d resets", resumes, kills.Load())
	}
	for _, g := range []*testGW{a, b} {
		if n := len(g.allLinks()); n != g.numLinks() {
			t.Fatalf("%d links up after the test, want %d", n, g.numLinks())
		}
	}
}
