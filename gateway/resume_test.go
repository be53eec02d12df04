package gateway

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
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

// scriptedLink is a link whose breaks and resumes follow a script of
// times after start: down from each breaks[k] until resumes[k].
type scriptedLink struct {
	start           time.Time
	breaks, resumes []time.Duration
	done            chan struct{}
}

func (s *scriptedLink) ResumeStats() relay.ResumeStats {
	now := time.Since(s.start)
	for k, b := range s.breaks {
		if now >= b && (k >= len(s.resumes) || now < s.resumes[k]) {
			return relay.ResumeStats{Enable: true, Down: true, DownFor: now - b}
		}
	}
	return relay.ResumeStats{Enable: true}
}

func (s *scriptedLink) Done() <-chan struct{} { return s.done }

// TestDownForRenewals: the acceptor probes a dialer only once a link has
// been down for the whole wait since its last break. An express link
// renewed once a relay.RenewGap goes down for a moment each time; a
// check that lands in the next renewal's moment is no reason to probe
// (it showed as a refused connection in the dialer's log).
func TestDownForRenewals(t *testing.T) {
	g := &Gateway{ctx: context.Background()}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }

	// Renewals at 0 and 1000 ms, each down for 30 ms: a check at 1 s sees
	// the second down, and must not take it for a second of down.
	l := &scriptedLink{start: time.Now(), breaks: []time.Duration{0, ms(990)}, resumes: []time.Duration{ms(30), ms(1020)}, done: make(chan struct{})}
	if g.downFor(l, time.Second) {
		t.Fatalf("downFor(1s) held after %v for a link down 30 ms at a time", time.Since(l.start))
	}
	if el := time.Since(l.start); el > ms(2500) {
		t.Errorf("downFor returned after %v, want by 2 s (its look 1 s after the second break)", el)
	}

	// Down for good from 200 ms, after a resume at 100 ms: held at 1.2 s.
	l = &scriptedLink{start: time.Now(), breaks: []time.Duration{0, ms(200)}, resumes: []time.Duration{ms(100)}, done: make(chan struct{})}
	if !g.downFor(l, time.Second) {
		t.Fatal("downFor(1s) false for a link down from 200 ms on")
	}
	if el := time.Since(l.start); el < ms(1200) || el > ms(1900) {
		t.Errorf("downFor held after %v, want 1.2 s (1 s after the last break)", el)
	}

	// A link that ends while down.
	l = &scriptedLink{start: time.Now(), breaks: []time.Duration{0}, done: make(chan struct{})}
	time.AfterFunc(ms(100), func() { close(l.done) })
	if g.downFor(l, time.Second) {
		t.Fatal("downFor held for a link that ended")
	}
}
