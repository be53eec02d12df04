package gateway

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Two sites of n gateway hosts each on loopback: gateway i of site a
// listens on 127.1.0.(1+i), of site b on 127.2.0.(1+i); nodes are
// 127.1.0.10 and 127.2.0.10 as in testMap.
func multiMap(t testing.TB, n int) *sitemap.Map {
	t.Helper()
	ap := func(s, i int) (netip.AddrPort, netip.AddrPort) {
		a := netip.AddrFrom4([4]byte{127, byte(s), 0, byte(1 + i)})
		return netip.AddrPortFrom(a, freePort(t, a)), netip.AddrPortFrom(a, freePort(t, a))
	}
	b := sitemap.NewBuilder()
	for s, name := range []string{"a", "b"} {
		lan, wan := ap(s+1, 0)
		b.AddSite(name, uint8(s+1), lan, wan)
		for i := 1; i < n; i++ {
			lan, wan := ap(s+1, i)
			b.AddGateway(name, lan, wan)
		}
	}
	m, err := b.AddNet("a", netip.MustParsePrefix("127.1.0.0/16")).
		AddNet("b", netip.MustParsePrefix("127.2.0.0/16")).Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestWhichGateway(t *testing.T) {
	m := multiMap(t, 3)
	a, _ := m.Site("a")
	g1 := a.Gateways[1]
	local := func(as ...netip.Addr) func() ([]netip.Addr, error) {
		return func() ([]netip.Addr, error) { return as, nil }
	}
	for _, c := range []struct {
		name     string
		lan, wan netip.AddrPort
		local    func() ([]netip.Addr, error)
		want     int
		err      string
	}{
		{name: "both flags", lan: g1.LAN, wan: g1.WAN, want: 1},
		{name: "wan only", wan: a.Gateways[2].WAN, want: 2},
		{name: "lan of one, wan of another", lan: g1.LAN, wan: a.Gateways[2].WAN, err: "--lan " + g1.LAN.String() + " --wan " + a.Gateways[2].WAN.String() + ": no gateway of site a"},
		{name: "host addresses", local: local(netip.MustParseAddr("10.0.0.1"), g1.LAN.Addr()), want: 1},
		{name: "no host address", local: local(netip.MustParseAddr("10.0.0.1")), err: "none has both its lan= and wan= addresses on this host"},
		{name: "several host addresses", local: local(g1.LAN.Addr(), a.LAN.Addr()), err: "more than one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := whichGateway(m, a, c.lan, c.wan, c.local)
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("got %d, %v; want an error with %q", got, err, c.err)
			case c.err != "" && !strings.Contains(err.Error(), "gateway a lan="+g1.LAN.String()):
				t.Fatalf("error does not quote the map's gateway lines: %v", err)
			case c.err == "" && (err != nil || got != c.want):
				t.Fatalf("got %d, %v; want %d", got, err, c.want)
			}
		})
	}
	// A site of one gateway needs no flag, whatever the host's addresses.
	one := testMap(t)
	s, _ := one.Site("a")
	if got, err := whichGateway(one, s, netip.AddrPort{}, netip.AddrPort{}, local()); err != nil || got != 0 {
		t.Fatalf("one gateway: %d, %v", got, err)
	}
}

// startMulti starts every gateway of multiMap(n) in this process and
// waits until each has its links to every gateway of the other site.
func startMulti(t *testing.T, n int) (*sitemap.Map, map[string][]*testGW) {
	m := multiMap(t, n)
	gws := map[string][]*testGW{}
	for _, name := range []string{"a", "b"} {
		s, _ := m.Site(name)
		for _, gw := range s.Gateways {
			gws[name] = append(gws[name], startGW(t, m, name, func(c *Config) { c.ListenLAN, c.ListenWAN = gw.LAN, gw.WAN }))
		}
	}
	for _, name := range []string{"a", "b"} {
		for i, g := range gws[name] {
			select {
			case <-g.Ready():
			case <-time.After(10 * time.Second):
				t.Fatalf("gateway %d of site %s: mesh did not come up", i, name)
			}
		}
	}
	return m, gws
}

// TestMultiGatewayMesh: with two gateway hosts per site every gateway
// keeps links to each gateway of the other site (four gateway pairs), and
// a gateway spreads the streams it forwards over the other site's
// gateways.
func TestMultiGatewayMesh(t *testing.T) {
	m, gws := startMulti(t, 2)
	for _, name := range []string{"a", "b"} {
		for i, g := range gws[name] {
			if g.gw != i {
				t.Fatalf("gateway %d of site %s thinks it is %d", i, name, g.gw)
			}
			if n := len(g.peerList()); n != 2 {
				t.Fatalf("gateway %d of site %s has %d peers, want 2", i, name, n)
			}
			if err := g.upFor([]string{"a", "b"}); err != nil {
				t.Fatalf("gateway %d of site %s: %v", i, name, err)
			}
		}
	}
	// Streams from gateway 0 of site a land through both gateways of b:
	// the destination sees each from the LAN address of the gateway
	// that delivered it.
	seen := make(chan netip.Addr, 64)
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
		seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		testnet.SumServer(c)
	})
	a, _ := m.Site("a")
	const streams = 16
	_, errs := testnet.Streams(streams, 7, func(r *rand.Rand) int { return testnet.StreamSize(r, 1<<20) },
		func() (*net.TCPConn, func() string, error) {
			c, err := lanOpen(a.Gateways[0].LAN, nodeA, dst)
			return c, func() string { return "" }, err
		})
	for _, err := range errs {
		t.Error(err)
	}
	by := map[netip.Addr]int{}
	for range streams {
		by[<-seen]++
	}
	b, _ := m.Site("b")
	for i, gw := range b.Gateways {
		if by[gw.LAN.Addr()] == 0 {
			t.Errorf("gateway %d of site b delivered none of %d streams (%v)", i, streams, by)
		}
	}
	// The source gateway's metrics count them per peer gateway.
	a0 := gws["a"][0]
	count := func(peer string) float64 {
		var d dto.Metric
		a0.m.streamsOpened.WithLabelValues(peer, "out").Write(&d)
		return d.GetCounter().GetValue()
	}
	out0, out1 := count("b"), count("b/1")
	if out0+out1 != streams || out0 != float64(by[b.Gateways[0].LAN.Addr()]) {
		t.Errorf("mpi5k_streams_opened_total of gateway a0: b %v, b/1 %v; the destination saw %v", out0, out1, by)
	}
}

// TestMultiGatewayReady: a site stays reachable, for /ready and
// /ready?sites=, while one of its gateway hosts is down.
func TestMultiGatewayReady(t *testing.T) {
	_, gws := startMulti(t, 2)
	a0 := gws["a"][0]
	gws["b"][1].stop()
	<-gws["b"][1].done
	b1 := a0.peer(peerID{2, 1})
	for deadline := time.Now().Add(20 * time.Second); len(a0.linksOf(b1)) == len(b1.links); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("links to the stopped gateway b/1 stay up")
		}
	}
	if err := a0.upFor([]string{"b"}); err != nil {
		t.Errorf("site b with gateway 0 up: %v", err)
	}
	if !a0.allUp() {
		t.Error("/ready says not ready with gateway 0 of site b up")
	}
	gws["b"][0].stop()
	<-gws["b"][0].done
	b0 := a0.peer(peerID{2, 0})
	for deadline := time.Now().Add(20 * time.Second); len(a0.linksOf(b0)) == len(b0.links); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("links to the stopped gateway b/0 stay up")
		}
	}
	if err := a0.upFor([]string{"b"}); err == nil || a0.allUp() {
		t.Errorf("every gateway of site b down, yet ready (%v)", err)
	}
}
