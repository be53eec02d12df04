package gateway

import (
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/seal"
)

// Strangers: hosts of 127.9.0.0/16, in no site of the map, that flood a
// gateway's WAN port.
func strangerAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 9, byte(i / 250), byte(i%250 + 1)})
}

// clientHello is the first TLS record a client offering mpi5k's protocol
// sends: what a stranger that has read the source would send.
func clientHello(t testing.TB) []byte { return testnet.ClientHello(t, protos[0][1]) }

// flood runs workers that connect to target from sources stranger
// addresses, each in its way (testnet.Flood). stop ends the flood and
// returns the connections made.
func flood(t testing.TB, target netip.AddrPort, sources, workers int) (stop func() int64) {
	return testnet.Flood{Target: target, Source: strangerAddr, Sources: sources, Workers: workers,
		Hello: clientHello(t), Junk: 64, Seed: 7}.Start()
}

// linksUp reports whether every link of g is up and connected.
func linksUp(g *testGW) bool {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	for _, p := range g.peers {
		for _, l := range p.links {
			if l == nil || l.Down() {
				return false
			}
		}
	}
	return true
}

// untilUp waits up to limit for every link of gs to be up and returns how
// long it took (limit if they were not).
func untilUp(start time.Time, limit time.Duration, gs ...*testGW) time.Duration {
	for time.Since(start) < limit {
		up := true
		for _, g := range gs {
			up = up && linksUp(g)
		}
		if up {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return limit
}

// TestStrangerFlood: strangers flooding the acceptor's WAN port from 1,
// 16 and 256 source addresses (connections that send nothing, half a
// ClientHello, garbage, a ClientHello a byte at a time, or a whole one)
// delay neither the links of the real peer gateway when it restarts nor
// their resume when a connection breaks by more than a second over the
// same without a flood.
func TestStrangerFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the WAN port for several seconds")
	}
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	b := startGW(t, m, "b", withKey(ks)) // accepts
	a := startGW(t, m, "a", withKey(ks)) // dials
	const limit = 10 * time.Second
	if d := untilUp(time.Now(), limit, a, b); d == limit {
		t.Fatal("links did not come up")
	}
	// restart stops a and starts it again: the time until every link of
	// both is up.
	restart := func() time.Duration {
		a.stop()
		<-a.done
		start := time.Now()
		a = startGW(t, m, "a", withKey(ks))
		return untilUp(start, limit, a, b)
	}
	// resume resets the connection of one of a's links: the time until it
	// is connected again on both sides.
	resume := func() time.Duration {
		ls := a.allLinks()
		if len(ls) == 0 {
			return limit // not up: nothing to break
		}
		l := ls[rand.IntN(len(ls))]
		n := l.ResumeStats().Resumes
		start := time.Now()
		resetConn(relay.TCPOf(l.Conn()))
		for l.ResumeStats().Resumes == n && time.Since(start) < limit {
			time.Sleep(time.Millisecond)
		}
		return untilUp(start, limit, a, b)
	}
	baseUp, baseResume := restart(), resume()
	t.Logf("no flood: restarted peer's links up in %v, a broken link resumed in %v", baseUp.Round(time.Millisecond), baseResume.Round(time.Millisecond))
	for _, sources := range []int{1, 16, 256} {
		stop := flood(t, wanB, sources, 32)
		time.Sleep(300 * time.Millisecond) // the flood fills what it can
		up, res := restart(), resume()
		n := stop()
		t.Logf("%d sources, %d connections: restarted peer's links up in %v, a broken link resumed in %v; refusals %v pending_source, %v pending, %v early_drop, %v tls",
			sources, n, up.Round(time.Millisecond), res.Round(time.Millisecond),
			refusedFor(t, b, "wan_pending_source"), refusedFor(t, b, "wan_pending"), refusedFor(t, b, "wan_early_drop"), refusedFor(t, b, "wan_tls"))
		if up > baseUp+time.Second || res > baseResume+time.Second {
			t.Errorf("%d stranger sources: links up in %v (%v without the flood), resumed in %v (%v without)", sources, up, baseUp, res, baseResume)
		}
	}
}

// TestStrangerSilence: what a stranger reads from a keyed gateway's WAN
// port. Whatever is not a ClientHello offering an mpi5k protocol (other
// protocols, none, a record longer than a gateway's handshake has, not
// TLS, a malformed record) gets a reset and not a byte: neither the
// certificate nor a TLS alert; so does a ClientHello left unfinished,
// once its time is up.
func TestStrangerSilence(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	b := startGW(t, keyedMap(t, lanA, wanA, lanB, wanB, ks), "b", withKey(ks))
	hello := func(protos ...string) []byte {
		c, s := net.Pipe()
		defer s.Close()
		go func() {
			tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: protos}).Handshake()
			c.Close()
		}()
		buf := make([]byte, 4096)
		n, _ := s.Read(buf)
		return buf[:n]
	}
	big := []byte{22, 3, 1, 0x40, 0} // a handshake record of 16 KiB
	full := clientHello(t)
	cases := []struct {
		what string
		send []byte
	}{
		{"ClientHello without ALPN", hello()},
		{"ClientHello offering h2", hello("h2", "http/1.1")},
		{"a 16 KiB record", big},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: gw\r\n\r\n")},
		{"a malformed handshake record", []byte{22, 3, 1, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"a record of an unknown version", []byte{22, 9, 9, 0, 4, 1, 2, 3, 4}},
		{"application data first", []byte{23, 3, 3, 0, 4, 1, 2, 3, 4}},
		{"half a ClientHello (then silence: strangerAuthTime)", full[:len(full)/2]},
	}
	for _, tc := range cases {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: strangerAddr(0).AsSlice()}, net.TCPAddrFromAddrPort(wanB))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(tc.send)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.Copy(io.Discard, c)
		c.Close()
		if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: read %d bytes, then %v; want a reset and nothing", tc.what, n, err)
		}
	}
	// The last is counted just after its reset.
	for deadline := time.Now().Add(time.Second); refusedFor(t, b, "wan_tls") < float64(len(cases)) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := refusedFor(t, b, "wan_tls"); n != float64(len(cases)) {
		t.Errorf("wan_tls refusals %v, want %d", n, len(cases))
	}
}

// TestUnknownKeyIntegrityALPN: a stranger that offers the integrity-only
// protocol and proves a key the map does not list is refused for its
// key (wan_auth), not as a gateway whose --wan-encrypt differs.
func TestUnknownKeyIntegrityALPN(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	b := startGW(t, m, "b", withKey(ks))
	// The stranger's own map lists its key for site a.
	bad := siteKeys{"a": newKeys(t, "a")["a"], "b": ks["b"]}
	forged := keyedMap(t, lanA, wanA, lanB, wanB, bad)
	auth, err := newPeerAuth(forged, mustSite(t, forged, "a"), bad["a"], "test", seal.ModeIntegrity)
	if err != nil {
		t.Fatal(err)
	}
	cfg := auth.base(true)
	cfg.InsecureSkipVerify, cfg.NextProtos = true, protos[seal.ModeIntegrity][:]
	c, err := net.DialTCP("tcp", &net.TCPAddr{IP: strangerAddr(1).AsSlice()}, net.TCPAddrFromAddrPort(wanB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cfg)
	tc.Handshake()
	tc.Read(make([]byte, 1)) // the acceptor's verdict on our certificate
	deadline := time.Now().Add(5 * time.Second)
	for refusedFor(t, b, "wan_auth")+refusedFor(t, b, "wan_encrypt") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a, e := refusedFor(t, b, "wan_auth"), refusedFor(t, b, "wan_encrypt"); a != 1 || e != 0 {
		t.Fatalf("refusals wan_auth %v, wan_encrypt %v; want 1 and 0", a, e)
	}
}

// TestEarlyDrop: the shared pool drops new connections at random past
// half of MaxPendingWAN, 30 % there rising linearly to all when full, and
// a map gateway's address takes its own pool whatever the shared one
// holds.
func TestEarlyDrop(t *testing.T) {
	m := testMap(t)
	site, _ := m.Site("b")
	g := &Gateway{site: site, cfg: Config{LimitsConfig: LimitsConfig{MaxPendingWAN: 16, MaxSourcePendingWAN: 1 << 20},
		WANConfig: WANConfig{WANConns: 1}, TuningConfig: TuningConfig{Express: true}}}
	g.mine = newLayout(&g.cfg, relay.Config{})
	g.smap.Store(m)
	g.admit.own, g.admit.other = map[netip.Addr]int{}, map[netip.Addr]int{}
	fill := func(n int) {
		for i := 0; g.admit.shared < n; i++ {
			if i > 10000 {
				t.Fatalf("cannot fill the pool to %d", n)
			}
			g.admitPending(strangerAddr(i % 200))
		}
	}
	for _, c := range []struct {
		held int
		want float64 // drop rate
	}{{0, 0}, {7, 0}, {8, 0.3}, {12, 0.65}, {15, 0.3 + 0.7*7/8}, {16, 1}} {
		fill(c.held)
		const n = 4000
		drops := 0
		for i := range n {
			s, why := g.admitPending(strangerAddr(i % 200))
			if why != "" {
				drops++
				continue
			}
			g.release(s)
		}
		if got := float64(drops) / n; got < c.want-0.04 || got > c.want+0.04 {
			t.Errorf("%d of 16 held: %.3f of new connections dropped, want %.2f", c.held, got, c.want)
		}
	}
	// Full: the peer gateway's address still gets its own 4.
	for i := range 4 {
		if s, why := g.admitPending(gwA); why != "" || s.shared {
			t.Fatalf("map peer's connection %d with the shared pool full: refused (%s) or shared (%v)", i, why, s.shared)
		}
	}
	if _, why := g.admitPending(gwA); why != "wan_pending" {
		t.Fatalf("map peer's 5th connection, its pool and the shared one full: %q, want wan_pending", why)
	}
}
