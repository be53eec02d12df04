package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"golang.org/x/sys/unix"
)

// fakePeer connects to g's WAN listener as link index of site a (from
// site a's gateway address) and exchanges HELLOs; rcvbuf > 0 shrinks the
// socket's receive buffer first, so the gateway's writes block early.
func fakePeer(t *testing.T, g *testGW, index, rcvbuf int) (*net.TCPConn, header.Hello) {
	t.Helper()
	c, ph, err := fakeHello(t, g, index, rcvbuf)
	if err != nil {
		t.Fatal(err)
	}
	return c, ph
}

// fakeHello is fakePeer that returns the handshake's error: a gateway
// that refuses the HELLO resets the connection without answering.
func fakeHello(t *testing.T, g *testGW, index, rcvbuf int) (*net.TCPConn, header.Hello, error) {
	t.Helper()
	return sendHello(t, g, g.helloIn(g.mine, index), rcvbuf)
}

// sendHello sends h, as site a's gateway, to g's WAN listener.
func sendHello(t *testing.T, g *testGW, h header.Hello, rcvbuf int) (*net.TCPConn, header.Hello, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: gwA.AsSlice()}, Control: func(_, _ string, rc syscall.RawConn) error {
		if rcvbuf > 0 {
			rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf) })
		}
		return nil
	}}
	c, err := d.Dial("tcp", g.WANAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h.SiteID, h.Name = 1, "a"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ph, err := relay.Handshake(ctx, c, h)
	return c.(*net.TCPConn), ph, err
}

// TestPingFlood: a peer that floods PINGs and never reads. The gateway's
// queue of PONGs is capped (MaxControl, default): its heap stays bounded
// and it closes the link.
func TestPingFlood(t *testing.T) {
	m := testMap(t)
	b := startGW(t, m, "b", func(c *Config) {
		if v := os.Getenv("MPI5K_TEST_MAXCONTROL"); v != "" { // to measure without the cap
			c.MaxControl, _ = strconv.Atoi(v)
		}
	})
	c, _ := fakePeer(t, b, 0, 4096)
	var pings []byte
	for range 4096 {
		pings = header.AppendFrame(pings, header.TypePing, 0, make([]byte, 8))
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	werr := make(chan error, 1)
	sent := 0
	go func() {
		for {
			n, err := c.Write(pings)
			sent += n / (header.Size + 8)
			if err != nil {
				werr <- err
				return
			}
		}
	}()
	start := time.Now()
	var peak uint64
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case err := <-werr:
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("flood ended with %v, want the link reset by the gateway", err)
			}
			done = true
		case <-tick.C:
			if time.Since(start) > 20*time.Second {
				t.Fatalf("link still up after 20 s of PINGs never read; heap grew by %d MiB", (peak-base)>>20)
			}
		}
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
	}
	grew := int64(peak) - int64(base)
	t.Logf("%d PINGs sent in %v before the gateway closed the link; heap peak %+d KiB over the start",
		sent, time.Since(start).Round(time.Millisecond), grew>>10)
	// 65536 queued frames of 88 bytes, up to twice over while the queue
	// grows (11 MiB), plus the reader's buffers: well under 64 MiB.
	if grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB under the flood", grew>>20)
	}
	if n := counter(t, b, "mpi5k_refusals_total"); n < 1 {
		t.Fatalf("mpi5k_refusals_total %v after the control queue overflowed", n)
	}
}

// refusedFor reads mpi5k_refusals_total for one reason.
func refusedFor(t *testing.T, g *testGW, reason string) float64 {
	t.Helper()
	mfs, err := g.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "mpi5k_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// lanOpenAs is lanOpen with the OPEN's source endpoint given.
func lanOpenAs(gw netip.AddrPort, local, src, dst netip.AddrPort) (*net.TCPConn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
	c, err := d.Dial("tcp", gw.String())
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	if !src.IsValid() {
		src = tc.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	body, err := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Label: "test"})
	if err != nil {
		return nil, err
	}
	if _, err := tc.Write(header.AppendFrame(nil, header.TypeOpen, 0, body)); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// TestLoopRefused: a gateway's address is never a destination, so OPENs
// cannot be chained through the gateways' own listeners; a node may not
// name a source port it does not own (PEER_QUERY would repeat it); and a
// connection the gateway dialed that comes back to its LAN listener is
// refused.
func TestLoopRefused(t *testing.T) {
	_, a, b := startPair(t, nil)
	for _, d := range []netip.AddrPort{b.LANAddr(), b.WANAddr(), netip.AddrPortFrom(gwB, 9)} {
		c, err := lanOpen(a.LANAddr(), nodeA, d)
		refused(t, c, err, "OPEN to gateway address "+d.String())
	}
	if n := refusedFor(t, a, "dst_gateway"); n != 3 {
		t.Fatalf("dst_gateway refusals %v, want 3", n)
	}
	// The chained loop of issue 35: an OPEN to gateway b's LAN listener
	// with the next OPEN pipelined behind it. Gateway a refuses the first.
	next, _ := header.AppendOpen(nil, &header.Open{Dst: a.LANAddr(), Src: netip.AddrPortFrom(gwB, 1)})
	c, err := lanOpen(a.LANAddr(), nodeA, b.LANAddr())
	if err == nil {
		_, err = c.Write(header.AppendFrame(nil, header.TypeOpen, 0, next))
	}
	refused(t, c, err, "chained OPEN")
	if n := counter(t, b, "mpi5k_streams_opened_total"); n != 0 {
		t.Fatalf("gateway b opened %v streams for the chained OPENs", n)
	}

	// A source port the node does not own.
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	c, err = lanOpenAs(a.LANAddr(), netip.AddrPortFrom(nodeA, 0), netip.AddrPortFrom(nodeA, 22), dst)
	refused(t, c, err, "OPEN naming a foreign source port")

	// A connection from one of the gateway's own outgoing sockets.
	own := netip.AddrPortFrom(gwB, freePort(t, gwB))
	key := recordKey{own, netip.AddrPortFrom(nodeB, 9)}
	b.records.put(key, record{src: netip.AddrPortFrom(nodeA, 1), site: 1})
	c, err = lanOpenAs(b.LANAddr(), own, netip.AddrPort{}, dst)
	refused(t, c, err, "LAN connection from the gateway's own socket")
	b.records.del(key)
	if n := refusedFor(t, b, "lan_from_gateway"); n != 1 {
		t.Fatalf("lan_from_gateway refusals %v, want 1", n)
	}
}

// peerLink runs a relay link over a fakePeer connection: site a as the
// gateway under test sees it.
func peerLink(t *testing.T, g *testGW) *relay.Link {
	c, ph := fakePeer(t, g, 0, 0)
	// The gateway's links resume: this one speaks ACK as its HELLO said
	// (its own session is never asked for).
	l := relay.NewTrunk(true, nil).AddResumable(c, relay.Config{PingInterval: time.Second}, ph, 0, false, 1)
	t.Cleanup(func() { l.Close() })
	return l
}

// openFrom opens a stream on peer link l from src to dst and returns the
// stream and the application's end of it.
func openFrom(t *testing.T, l *relay.Link, src netip.AddrPort, dst netip.AddrPort) (*relay.Stream, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	app, err := net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	gw, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Open(&header.Open{Dst: dst, Src: src}, relay.WrapTCP(gw))
	if err != nil {
		t.Fatal(err)
	}
	return s, app
}

func streamEnd(t *testing.T, s *relay.Stream, what string) header.Code {
	t.Helper()
	select {
	case <-s.Done():
		return s.Code()
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: stream still open after 10 s", what)
	}
	return 0
}

// TestWANOpenToGateway: a peer's OPEN to a gateway address is refused.
func TestWANOpenToGateway(t *testing.T) {
	b := startGW(t, testMap(t), "b", nil)
	l := peerLink(t, b)
	for _, d := range []netip.AddrPort{b.LANAddr(), b.WANAddr()} {
		s, _ := openFrom(t, l, netip.AddrPortFrom(nodeA, 1000), d)
		if code := streamEnd(t, s, "OPEN to "+d.String()); code != header.CodePolicy {
			t.Fatalf("OPEN to gateway address %v ended with %v, want %v", d, code, header.CodePolicy)
		}
	}
	if n := refusedFor(t, b, "dst_gateway"); n != 2 {
		t.Fatalf("dst_gateway refusals %v, want 2", n)
	}
}

// TestHelloInUse: a HELLO for a link index whose link works does not
// replace it; the streams on it go on.
func TestHelloInUse(t *testing.T) {
	_, a, b := startPair(t, nil)
	dst := testnet.Serve(t, nodeB, echoServer)
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(what string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	echo("before")
	old := b.allLinks()
	for i := range b.mine.numLinks() {
		if b.mine.isExpress(i) {
			continue // a working express link may be renewed: it retires without resetting streams
		}
		fake, _, err := fakeHello(t, b, i, 0)
		if err == nil {
			expectReset(t, fake, fmt.Sprintf("forged HELLO for link %d", i))
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("forged HELLO for link %d: %v, want a reset", i, err)
		}
	}
	echo("after the forged HELLOs")
	if n := refusedFor(t, b, "wan_link_in_use"); n != float64(b.cfg.WANConns) {
		t.Fatalf("wan_link_in_use refusals %v, want %d", n, b.cfg.WANConns)
	}
	now := b.allLinks()
	for i := range old {
		if old[i] != now[i] {
			t.Fatalf("link %d was replaced", i)
		}
	}
}

// TestStreamLimits: streams per LAN source host and per peer site, LAN
// connections waiting for their first frame and WAN connections in their
// HELLO exchange are capped; each refusal is counted by reason.
func TestStreamLimits(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) {
		c.MaxSourceStreams, c.MaxPendingLAN, c.MaxPeerStreams = 3, 2, 4
	})
	dst := testnet.Serve(t, nodeB, echoServer)
	open := func(src netip.Addr) (*net.TCPConn, error) {
		c, err := lanOpen(a.LANAddr(), src, dst)
		if err != nil {
			return nil, err
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return c, err
		}
		_, err = io.ReadFull(c, make([]byte, 1))
		c.SetDeadline(time.Time{})
		return c, err
	}
	var held []*net.TCPConn
	for range 3 {
		c, err := open(nodeA)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	c, err := open(nodeA)
	refused(t, c, err, "fourth stream of one source")
	if n := refusedFor(t, a, "source_streams"); n != 1 {
		t.Fatalf("source_streams refusals %v, want 1", n)
	}
	// Another host of the site still gets its streams; past four in all,
	// site b refuses the peer's OPEN (code 10), which resets the source.
	nodeA2 := netip.MustParseAddr("127.1.0.11")
	c, err = open(nodeA2)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, c)
	c, err = open(nodeA2)
	refused(t, c, err, "fifth stream into site b")
	if n := refusedFor(t, b, "peer_streams"); n != 1 {
		t.Fatalf("peer_streams refusals %v, want 1", n)
	}
	// A stream that ends gives its place back.
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := open(nodeA)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream after one ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Connections that never send their first frame.
	var idle []net.Conn
	for range 2 {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, net.TCPAddrFromAddrPort(a.LANAddr()))
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	for a.lanPending.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	c, err = lanOpen(a.LANAddr(), nodeA, dst)
	refused(t, c, err, "LAN connection past MaxPendingLAN")
	if n := refusedFor(t, a, "lan_pending"); n != 1 {
		t.Fatalf("lan_pending refusals %v, want 1", n)
	}
	for _, c := range append(idle, toConns(held)...) {
		c.Close()
	}
}

func toConns(cs []*net.TCPConn) []net.Conn {
	r := make([]net.Conn, len(cs))
	for i, c := range cs {
		r[i] = c
	}
	return r
}

// TestPendingWAN: WAN connections to a keyed gateway from sources that
// are no map gateway's address, which never send a byte, are capped per
// source and in all, and reset at accept past the caps, while the map
// peer's address still gets a slot. (A keyless gateway resets them at
// once: their source is no peer's.)
func TestPendingWAN(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	b := startGW(t, keyedMap(t, lanA, wanA, lanB, wanB, ks), "b", func(c *Config) {
		withKey(ks)(c)
		c.MaxPendingWAN, c.MaxSourcePendingWAN = 4, 2
	})
	dial := func(src netip.Addr) (*net.TCPConn, error) {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: src.AsSlice()}, net.TCPAddrFromAddrPort(b.WANAddr()))
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	// The gateway's HELLO never comes: the connection is reset at accept
	// (so quickly that the reset may already fail the dial).
	expectReset := func(c *net.TCPConn, err error, what string) {
		t.Helper()
		if err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s: %v, want a reset", what, err)
		}
	}
	one := netip.MustParseAddr("127.9.0.1")
	for range 2 {
		if _, err := dial(one); err != nil {
			t.Fatal(err)
		}
	}
	for b.wanPending.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	c, err := dial(one)
	expectReset(c, err, "third pending WAN connection from one source")
	if n := refusedFor(t, b, "wan_pending_source"); n != 1 {
		t.Fatalf("wan_pending_source refusals %v, want 1", n)
	}
	// Past half of MaxPendingWAN some are dropped at random: dial from
	// fresh sources until the pool is full.
	for i := 2; b.admit.nshared.Load() < 4; i++ {
		if i > 200 {
			t.Fatalf("pool not full after 200 dials: %d pending", b.admit.nshared.Load())
		}
		dial(netip.AddrFrom4([4]byte{127, 9, 0, byte(i)}))
		time.Sleep(2 * time.Millisecond)
	}
	c, err = dial(netip.MustParseAddr("127.9.1.1"))
	expectReset(c, err, "a pending WAN connection past MaxPendingWAN")
	if n := refusedFor(t, b, "wan_pending"); n != 1 {
		t.Fatalf("wan_pending refusals %v, want 1", n)
	}
	// The peer's own address has its pool: it is not refused.
	c, err = dial(gwA)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection from the map peer's address with the shared pool full: %v, want it held", err)
	}
}

// blackhole returns an address in site b whose listener never accepts and
// whose accept queue is full, so a connect to it hangs (SYNs dropped).
func blackhole(t *testing.T) netip.AddrPort {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: nodeB.As4()}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	p := netip.AddrPortFrom(nodeB, uint16(sa.(*unix.SockaddrInet4).Port))
	for range 2 { // fill the queue (backlog 0 holds one)
		c, err := net.DialTimeout("tcp", p.String(), time.Second)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	return p
}

// TestEarlyDataBound: DATA for streams whose destination does not accept
// stays within MaxEarly; the streams past it are reset (code 10).
func TestEarlyDataBound(t *testing.T) {
	const early = 1 << 20
	b := startGW(t, testMap(t), "b", func(c *Config) { c.MaxEarly, c.DialTimeout = early, time.Minute })
	l := peerLink(t, b)
	dst := blackhole(t)
	var ss []*relay.Stream
	for i := range 8 {
		s, app := openFrom(t, l, netip.AddrPortFrom(nodeA, uint16(1000+i)), dst)
		app.Write(make([]byte, 256<<10)) // the window b grants (startGW)
		ss = append(ss, s)
	}
	time.Sleep(time.Second) // for the DATA to arrive
	limited := 0
	for _, s := range ss {
		select {
		case <-s.Done():
			if s.Code() != header.CodeLimit {
				t.Fatalf("stream ended with %v, want %v", s.Code(), header.CodeLimit)
			}
			limited++
		default:
		}
	}
	if e := b.peers[peerID{1, 0}].trunk.EarlyBytes(); e > early {
		t.Fatalf("%d early bytes buffered, limit %d", e, early)
	}
	if limited < 4 || limited == 8 {
		t.Fatalf("%d of 8 streams of 256 KiB reset with a limit of 1 MiB", limited)
	}
	if n := refusedFor(t, b, "early_data"); n != float64(limited) {
		t.Fatalf("early_data refusals %v, want %d", n, limited)
	}
}

// TestMetricsConnCap: the /metrics server holds at most maxMetricsConns
// connections; one more waits, unanswered, until the server closes the
// silent ones (metricsHeaderTime), and is then answered.
func TestMetricsConnCap(t *testing.T) {
	addr := netip.AddrPortFrom(gwB, freePort(t, gwB))
	startGW(t, testMap(t), "b", func(c *Config) { c.MetricsAddr = addr.String() })
	var silent []net.Conn
	for range maxMetricsConns {
		c, err := net.Dial("tcp", addr.String())
		for i := 0; err != nil && i < 50; i++ { // the listener opens in Run
			time.Sleep(20 * time.Millisecond)
			c, err = net.Dial("tcp", addr.String())
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	start := time.Now()
	late, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if _, err := late.Write([]byte("GET /ready HTTP/1.1\r\nHost: gw\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	late.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := late.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %d past the cap of %d: read %d bytes, %v; want it held unanswered", maxMetricsConns+1, maxMetricsConns, n, err)
	}
	for _, c := range silent {
		c.SetReadDeadline(time.Now().Add(metricsHeaderTime + 3*time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a connection that sends nothing is still open after %v: %v", time.Since(start), err)
		}
	}
	late.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := late.Read(make([]byte, 64)); err != nil {
		t.Fatalf("the waiting connection, once the silent ones closed: %v", err)
	}
}
