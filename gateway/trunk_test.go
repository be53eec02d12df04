package gateway

import (
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// onHost is the tweak of a gateway started with --wan-trunk trunk (and
// flags) on a host whose default TCP is cc, through Flags.Config as
// mpi5k-gateway starts it; the test settings startGW made stay.
func onHost(t *testing.T, trunk, cc string, flags ...string) func(*Config) {
	return func(c *Config) {
		defer func(f func() (string, error)) { hostCC = f }(hostCC)
		hostCC = func() (string, error) { return cc, nil }
		n, err := testConfig(c.Map, c.Site, append([]string{"--wan-trunk", trunk}, flags...)...)
		if err != nil {
			t.Fatal(err)
		}
		keep := func(d, s *Config) {
			d.Chunk, d.Window, d.Logger = s.Chunk, s.Window, s.Logger
			d.DrainTimeout, d.PingInterval, d.FirstFrame = s.DrainTimeout, s.PingInterval, s.FirstFrame
		}
		keep(&n, c)
		if n.TrunkAlt != nil {
			keep(n.TrunkAlt, c)
		}
		*c = n
	}
}

// pairLayout waits until every link of g's only peer's agreed layout is
// up and returns the layout.
func pairLayout(t *testing.T, g *testGW) *layout {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ps := g.peerList()
		if len(ps) != 1 {
			t.Fatalf("%d peers", len(ps))
		}
		l := ps[0].lay.Load()
		if n := len(g.linksOf(ps[0])); n == l.numLinks() && g.allUp() {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("site %s: %d links up, want the %s layout's %d", g.site.Name, len(g.linksOf(ps[0])), l.preset, l.numLinks())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkStream sends a checksummed stream from a's site to b's.
func checkStream(t *testing.T, a *testGW, seed uint64) {
	t.Helper()
	sum := testnet.Serve(t, nodeB, testnet.SumServer)
	c, err := lanOpen(a.LANAddr(), nodeA, sum)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := testnet.SendAndCheck(c, rand.New(rand.NewPCG(seed, seed)), 256<<10); err != nil {
		t.Fatalf("stream through the pair: %v", err)
	}
}

// TestTrunkAgree: each pair of --wan-trunk settings that can work
// together agrees on one layout on both sides, with every link of it up
// and a stream through it: the preset both run, a fixed side's beside
// auto (dialer or acceptor), and shared for two auto gateways whose
// hosts' TCPs differ. Site a dials.
func TestTrunkAgree(t *testing.T) {
	for _, tc := range []struct {
		name        string
		aTrunk, aCC string
		bTrunk, bCC string
		want        string
	}{
		{name: "auto on two BBR hosts", aTrunk: TrunkAuto, aCC: "bbr", bTrunk: TrunkAuto, bCC: "bbr", want: TrunkParallel},
		{name: "auto on BBR dials auto on CUBIC", aTrunk: TrunkAuto, aCC: "bbr", bTrunk: TrunkAuto, bCC: "cubic", want: TrunkShared},
		{name: "auto on CUBIC dials auto on BBR", aTrunk: TrunkAuto, aCC: "cubic", bTrunk: TrunkAuto, bCC: "bbr", want: TrunkShared},
		{name: "auto on two CUBIC hosts", aTrunk: TrunkAuto, aCC: "cubic", bTrunk: TrunkAuto, bCC: "cubic", want: TrunkShared},
		{name: "auto dials parallel", aTrunk: TrunkAuto, aCC: "cubic", bTrunk: TrunkParallel, bCC: "cubic", want: TrunkParallel},
		{name: "parallel dials auto", aTrunk: TrunkParallel, aCC: "cubic", bTrunk: TrunkAuto, bCC: "cubic", want: TrunkParallel},
		{name: "shared dials auto", aTrunk: TrunkShared, aCC: "bbr", bTrunk: TrunkAuto, bCC: "bbr", want: TrunkShared},
		{name: "auto dials shared", aTrunk: TrunkAuto, aCC: "bbr", bTrunk: TrunkShared, bCC: "bbr", want: TrunkShared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMap(t)
			a := startGW(t, m, "a", onHost(t, tc.aTrunk, tc.aCC))
			b := startGW(t, m, "b", onHost(t, tc.bTrunk, tc.bCC))
			la, lb := pairLayout(t, a), pairLayout(t, b)
			wantLinks := 2
			if tc.want == TrunkParallel {
				wantLinks = parallelLinks
			}
			for site, l := range map[string]*layout{"a": la, "b": lb} {
				if l.preset != tc.want || l.numLinks() != wantLinks || l.express != (tc.want == TrunkShared) {
					t.Errorf("site %s: %s trunk of %d links (express %v), want %s of %d", site, l.preset, l.numLinks(), l.express, tc.want, wantLinks)
				}
			}
			checkStream(t, a, 7)
			for name, g := range map[string]*testGW{"a": a, "b": b} {
				for _, l := range g.allLinks() {
					if l.Express() != (tc.want == TrunkShared && l.Index() == 1) {
						t.Errorf("site %s: link %d express %v", name, l.Index(), l.Express())
					}
				}
			}
		})
	}
}

// TestTrunkAgreeFlags: two auto gateways that agree on a preset but whose
// flags give it different links refuse each other, naming the flags.
func TestTrunkAgreeFlags(t *testing.T) {
	m := testMap(t)
	a := startGW(t, m, "a", onHost(t, TrunkAuto, "bbr"))
	b := startGW(t, m, "b", onHost(t, TrunkAuto, "bbr", "--wan-conns", "4"))
	neverReady(t, a, b, "a peer whose parallel trunk has 4 links")
	for _, p := range a.peerList() {
		_, err := a.checkHello(b.helloIn(b.mine, 0), p, -1)
		if err == nil || !strings.Contains(err.Error(), "peer has 4 links per site pair") || !strings.Contains(err.Error(), "--wan-conns") {
			t.Errorf("a answer of 4 links: %v", err)
		}
	}
}

// TestTrunkAgreeRestart: a pair takes another layout when the peer
// restarts with another preset, once the old layout's links have failed:
// the dial loops the new layout has come up, the others park.
func TestTrunkAgreeRestart(t *testing.T) {
	for _, tc := range []struct{ from, to string }{{TrunkShared, TrunkParallel}, {TrunkParallel, TrunkShared}} {
		t.Run(tc.from+" to "+tc.to, func(t *testing.T) {
			m := testMap(t)
			a := startGW(t, m, "a", onHost(t, TrunkAuto, "cubic"))
			b := startGW(t, m, "b", onHost(t, tc.from, "cubic"))
			if l := pairLayout(t, a); l.preset != tc.from {
				t.Fatalf("before: %s", l.preset)
			}
			checkStream(t, a, 1)
			b.stop()
			<-b.done
			start := time.Now()
			b = startGW(t, m, "b", onHost(t, tc.to, "cubic"))
			for a.peerList()[0].lay.Load().preset != tc.to {
				if time.Since(start) > 20*time.Second {
					t.Fatalf("a kept the %s layout after b restarted %s", tc.from, tc.to)
				}
				time.Sleep(10 * time.Millisecond)
			}
			la, lb := pairLayout(t, a), pairLayout(t, b)
			n := la.numLinks()
			if la.preset != tc.to || lb.preset != tc.to || len(a.allLinks()) != n || len(b.allLinks()) != n {
				t.Fatalf("after b restarts %s: a %s with %d links, b %s with %d", tc.to, la.preset, len(a.allLinks()), lb.preset, len(b.allLinks()))
			}
			t.Logf("a took the %s layout %v after b restarted", tc.to, time.Since(start).Round(time.Millisecond))
			checkStream(t, a, 2)
		})
	}
}

// TestTrunkParkedAnswer: the acceptor's side of a link the agreed layout
// does not have. A HELLO from an auto dialer for link 5 of a parallel
// trunk, to a shared gateway, gets an answer that states the shared
// layout, and the connection then closes without becoming a link; the
// same HELLO from a fixed parallel dialer is refused without an answer.
func TestTrunkParkedAnswer(t *testing.T) {
	m := testMap(t)
	b := startGW(t, m, "b", onHost(t, TrunkShared, "bbr"))
	h := b.helloIn(b.mine, 0)
	h.LinkIndex, h.LinkCount = 5, parallelLinks
	h.Features &^= header.FeatureExpress | header.FeatureRenew
	h.Trunk, h.TrunkAuto = header.TrunkParallel, true
	c, ph, err := sendHello(t, b, h, 0)
	if err != nil {
		t.Fatalf("auto dialer's HELLO for link 5: %v", err)
	}
	if ph.LinkCount != 2 || ph.Trunk != header.TrunkShared || ph.TrunkAuto || ph.Features&header.FeatureExpress == 0 {
		t.Errorf("answer: %d links, trunk %d auto %v, features %#x; want the shared layout", ph.LinkCount, ph.Trunk, ph.TrunkAuto, ph.Features)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("after the answer: read %d, %v; want the connection closed", n, err)
	}
	if n := len(b.allLinks()); n != 0 {
		t.Errorf("%d links up, want none", n)
	}
	h.TrunkAuto = false
	if _, ph, err := sendHello(t, b, h, 0); err == nil {
		t.Errorf("fixed parallel dialer's HELLO: answered %+v, want a refusal", ph)
	}
}

// TestTrunkChangeRefused: a HELLO that would change a working pair's
// trunk, forged or from a peer restarted with another preset before its
// old links failed, is refused (wan_trunk_change) without an answer, and
// the pair keeps its layout, its links and its streams.
func TestTrunkChangeRefused(t *testing.T) {
	m := testMap(t)
	b := startGW(t, m, "b", onHost(t, TrunkAuto, "cubic"))
	a := startGW(t, m, "a", onHost(t, TrunkShared, "cubic"))
	pairLayout(t, a)
	if l := pairLayout(t, b); l.preset != TrunkShared || b.alt.preset != TrunkParallel {
		t.Fatalf("b runs %s beside %v", l.preset, b.alt.preset)
	}
	old := b.allLinks()
	h := b.helloIn(b.alt, 0) // a fixed parallel peer's HELLO, from a's address
	h.TrunkAuto = false
	if _, ph, err := sendHello(t, b, h, 0); err == nil {
		t.Fatalf("HELLO changing a working pair's trunk: answered %+v", ph)
	}
	if n := refusedFor(t, b, "wan_trunk_change"); n != 1 {
		t.Errorf("%v wan_trunk_change refusals, want 1", n)
	}
	if l := b.peerList()[0].lay.Load(); l.preset != TrunkShared || !slices.Equal(b.allLinks(), old) {
		t.Errorf("after the refusal b runs %s with links %v, was %v", l.preset, b.allLinks(), old)
	}
	checkStream(t, a, 3)
}
