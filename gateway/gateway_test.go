package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tcpinfo"
	"github.com/mpi5k/mpi5k/tuning"
)

// Two sites on loopback addresses: site a is 127.1.0.0/16, site b
// 127.2.0.0/16; each gateway listens on x.x.0.1. Linux routes all of
// 127/8 to lo, so no namespace is needed.
var (
	gwA   = netip.MustParseAddr("127.1.0.1")
	gwB   = netip.MustParseAddr("127.2.0.1")
	nodeA = netip.MustParseAddr("127.1.0.10")
	nodeB = netip.MustParseAddr("127.2.0.10")
)

func freePort(t testing.TB, a netip.Addr) uint16 {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		p := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		// The kernel may hand a port just closed out again: a map whose
		// LAN and WAN addresses came from two calls then named one port
		// twice (CI saw "lan and wan are the same listener").
		if _, dup := portsHandedOut.LoadOrStore(netip.AddrPortFrom(a, p), true); !dup {
			return p
		}
	}
}

// portsHandedOut holds every address freePort returned in this process.
var portsHandedOut sync.Map

func testMap(t testing.TB) *sitemap.Map {
	m, err := sitemap.NewBuilder().
		AddSite("a", 1, netip.AddrPortFrom(gwA, freePort(t, gwA)), netip.AddrPortFrom(gwA, freePort(t, gwA))).
		AddSite("b", 2, netip.AddrPortFrom(gwB, freePort(t, gwB)), netip.AddrPortFrom(gwB, freePort(t, gwB))).
		AddNet("a", netip.MustParsePrefix("127.1.0.0/16")).
		AddNet("b", netip.MustParsePrefix("127.2.0.0/16")).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type testGW struct {
	*Gateway
	stop context.CancelFunc
	done chan struct{}
}

// testFlags turn off what reaches beyond the test process or waits on
// real WAN timings: keep-warm (a host-wide sysctl), queue control and the
// WAN timer floors, which these loopback tests have always run without.
// Their destinations are test servers, not ranks that register: every
// port is allowed. They run the shared trunk whatever the machine's TCP
// (auto would pick parallel on a BBR host); trunk_test.go runs the rest.
var testFlags = []string{"--wan-trunk=shared", "--wan-keep-warm=false", "--wan-queue=0", "--wan-rto-min=0", "--wan-delack-max=0", "--wan-allow-ports=any"}

// testConfig is the Config of the tests' gateways: testFlags, then flags.
func testConfig(m *sitemap.Map, site string, flags ...string) (Config, error) {
	fs := pflag.NewFlagSet("test gateway", pflag.ContinueOnError)
	f := NewFlags(fs, false)
	if err := fs.Parse(append(slices.Clone(testFlags), flags...)); err != nil {
		return Config{}, err
	}
	cfg, err := f.Config()
	cfg.Map, cfg.Site = m, site
	return cfg, err
}

func startGW(t testing.TB, m *sitemap.Map, site string, tweak func(*Config)) *testGW {
	t.Helper()
	lvl := slog.LevelWarn
	if os.Getenv("MPI5K_TEST_LOG") != "" {
		lvl = slog.LevelDebug
	}
	// Keepalive at 5 s (dead after 20 s) and a minute for the first LAN
	// frame: these tests run clients, servers and both gateways in one
	// process, where 2000 busy goroutines (more so under -race) can keep a
	// gateway goroutine off the CPU for seconds.
	cfg, err := testConfig(m, site)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Chunk, cfg.Window = 64<<10, 256<<10
	cfg.DrainTimeout, cfg.PingInterval, cfg.FirstFrame = time.Second, 5*time.Second, time.Minute
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if tweak != nil {
		tweak(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tg := &testGW{Gateway: g, stop: cancel, done: make(chan struct{})}
	go func() { g.Run(ctx); close(tg.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-tg.done:
		case <-time.After(10 * time.Second):
			t.Error("gateway did not stop")
		}
	})
	return tg
}

func startPair(t testing.TB, tweak func(*Config)) (*sitemap.Map, *testGW, *testGW) {
	m := testMap(t)
	a := startGW(t, m, "a", tweak)
	b := startGW(t, m, "b", tweak)
	for _, g := range []*testGW{a, b} {
		select {
		case <-g.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("mesh did not come up")
		}
	}
	return m, a, b
}

// lanOpen does what the shim does: connect from src to the site gateway's
// LAN address, send OPEN with the destination and our own endpoint, then
// use the connection for raw bytes.
func lanOpen(gw netip.AddrPort, src netip.Addr, dst netip.AddrPort) (*net.TCPConn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", gw.String())
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	o := header.Open{Dst: dst, Src: tc.LocalAddr().(*net.TCPAddr).AddrPort(), Label: "test"}
	body, err := header.AppendOpen(nil, &o)
	if err != nil {
		return nil, err
	}
	if _, err := tc.Write(header.AppendFrame(nil, header.TypeOpen, 0, body)); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// TestThousandStreams: 1000 concurrent streams of random sizes 0..8 MiB
// through two gateways, end-to-end SHA-256 per stream: nothing lost or
// corrupted. (Under -race the sizes are capped at 1 MiB.)
func TestThousandStreams(t *testing.T) {
	_, a, _ := startPair(t, nil)
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	maxSize := 8 << 20
	if raceEnabled {
		maxSize = 1 << 20
	}
	const n = 1000
	start := time.Now()
	total := sumStreams(t, a, dst, n, maxSize, 42)
	d := time.Since(start)
	t.Logf("%d streams, %d bytes in %v (%.0f Mbit/s)", n, total, d.Round(time.Millisecond), float64(total)*8/d.Seconds()/1e6)
}

// sumStreams runs n concurrent checksummed streams of random sizes up to
// maxSize from a's site to dst, reports each failure, and returns the
// bytes checked.
func sumStreams(t *testing.T, a *testGW, dst netip.AddrPort, n, maxSize int, seed uint64) int64 {
	total, errs := testnet.Streams(n, seed, func(r *rand.Rand) int { return testnet.StreamSize(r, maxSize) },
		func() (*net.TCPConn, func() string, error) {
			c, err := lanOpen(a.LANAddr(), nodeA, dst)
			return c, nil, err
		})
	for _, err := range errs {
		t.Error(err)
	}
	return total
}

// TestSmallMessageAllocs: a 1-byte ping-pong through the gateway pair (in
// this process, DATA_AT frames over a trunk, metrics and timers running)
// allocates nothing per message.
func TestSmallMessageAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short, or the race detector (its instrumentation allocates)")
	}
	_, a, _ := startPair(t, nil)
	app, err := lanOpen(a.LANAddr(), nodeA, testnet.Echo(t, nodeB))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	per := testnet.RoundTripAllocs(t, app, 2000)
	t.Logf("%.3f allocations per round trip", per)
	if per > 0.5 {
		t.Errorf("%.2f allocations per round trip; the small-message path should make none", per)
	}
}

func TestHalfCloseAndReset(t *testing.T) {
	_, a, _ := startPair(t, nil)
	// Half-close: the server answers only after our EOF.
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := testnet.SendAndCheck(c, rand.New(rand.NewPCG(1, 1)), 300<<10); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// Reset by the destination reaches the source as ECONNRESET.
	rst := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
		io.ReadFull(c, make([]byte, 3))
		c.SetLinger(0)
		c.Close()
	})
	c, err = lanOpen(a.LANAddr(), nodeA, rst)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("abc"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("source after destination reset: %v", err)
	}
	c.Close()

	// Reset by the source reaches the destination.
	got := make(chan error, 1)
	sink := testnet.Serve(t, nodeB, func(c *net.TCPConn) { _, err := io.Copy(io.Discard, c); got <- err })
	c, err = lanOpen(a.LANAddr(), nodeA, sink)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("abc"))
	time.Sleep(50 * time.Millisecond)
	c.SetLinger(0)
	c.Close()
	select {
	case err := <-got:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("destination after source reset: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reset did not reach the destination")
	}

	// Connecting to a closed port: the source sees a reset.
	closed := netip.AddrPortFrom(nodeB, freePort(t, nodeB))
	c, err = lanOpen(a.LANAddr(), nodeA, closed)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("open to a closed port: %v", err)
	}
}

// refused checks that a connection attempt was dropped by the gateway:
// the drop may already show in the dial or the first write (the gateway
// resets as soon as it has decided), or in the first read.
func refused(t *testing.T, c *net.TCPConn, err error, what string) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("%s: %v, want the connection dropped", what, err)
		}
		return
	}
	expectReset(t, c, what)
}

func expectReset(t *testing.T, c *net.TCPConn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v, want the connection dropped", what, err)
	}
	c.Close()
}

// TestPolicy: the gateway is never an open relay.
func TestPolicy(t *testing.T) {
	_, a, b := startPair(t, nil)
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	// A node of another site may not use gateway a.
	c, err := lanOpen(a.LANAddr(), nodeB, dst)
	refused(t, c, err, "LAN connection from outside the site")
	// An address in no site at all.
	c, err = lanOpen(a.LANAddr(), netip.MustParseAddr("127.3.0.1"), dst)
	refused(t, c, err, "LAN connection from an unknown address")
	// A destination in our own site or outside the map.
	for _, d := range []netip.AddrPort{netip.AddrPortFrom(nodeA, 9), netip.MustParseAddrPort("127.3.0.1:9")} {
		c, err = lanOpen(a.LANAddr(), nodeA, d)
		refused(t, c, err, "OPEN to "+d.String())
	}
	// Garbage instead of OPEN.
	raw, err := net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, net.TCPAddrFromAddrPort(a.LANAddr()))
	if err == nil {
		_, err = raw.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	}
	refused(t, raw, err, "garbage first frame")
	if n := counter(t, a, "mpi5k_lan_refused_total"); n != 5 {
		t.Fatalf("lan refused counter %v, want 5", n)
	}

	// A WAN peer not in the map is refused.
	hb, _ := header.AppendHello(nil, &header.Hello{SiteID: 1, LinkCount: 1, MaxPayload: 1 << 20, Window: 1 << 20, Name: "a"})
	wan, err := net.DialTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 3, 0, 1)}, net.TCPAddrFromAddrPort(b.WANAddr()))
	if err == nil {
		_, err = wan.Write(header.AppendFrame(nil, header.TypeHello, 0, hb))
	}
	refused(t, wan, err, "WAN connection from outside the map")
	// Right address, wrong identity: site a's address claiming to be site 3.
	wan, err = net.DialTCP("tcp", &net.TCPAddr{IP: gwA.AsSlice()}, net.TCPAddrFromAddrPort(b.WANAddr()))
	if err != nil {
		t.Fatal(err)
	}
	hb, _ = header.AppendHello(nil, &header.Hello{SiteID: 3, LinkCount: 1, MaxPayload: 1 << 20, Window: 1 << 20, Name: "c"})
	wan.Write(header.AppendFrame(nil, header.TypeHello, 0, hb))
	io.ReadFull(wan, make([]byte, header.Size+13+1)) // b's own HELLO
	expectReset(t, wan, "WAN HELLO with a foreign site id")
	if n := counter(t, b, "mpi5k_wan_refused_total"); n != 2 {
		t.Fatalf("wan refused counter %v, want 2", n)
	}
}

// counter reads a metric through the registry.
func counter(t *testing.T, g *testGW, name string) float64 {
	mfs, err := g.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
			return v
		}
	}
	return 0
}

// TestPeerQuery: the destination's shim learns the true source of a
// relayed connection from its gateway.
func TestPeerQuery(t *testing.T) {
	_, a, b := startPair(t, nil)
	type seen struct{ remote, local netip.AddrPort }
	ch := make(chan seen, 1)
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
		ch <- seen{c.RemoteAddr().(*net.TCPAddr).AddrPort(), c.LocalAddr().(*net.TCPAddr).AddrPort()}
		io.Copy(io.Discard, c)
	})
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-ch
	if s.remote.Addr() != gwB {
		t.Fatalf("destination sees %v, want the gateway's LAN address", s.remote)
	}
	q, err := net.DialTCP("tcp", &net.TCPAddr{IP: nodeB.AsSlice()}, net.TCPAddrFromAddrPort(b.LANAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r := header.NewReader(q, 0)
	buf := make([]byte, 64)
	for i, qq := range []header.PeerQuery{{Seen: s.remote, Local: s.local}, {Seen: s.remote, Local: netip.AddrPortFrom(nodeB, 1)}} {
		q.Write(header.AppendFrame(nil, header.TypePeerQuery, uint32(7+i), header.AppendPeerQuery(nil, &qq)))
		h, p, err := r.ReadFrame(buf)
		if err != nil || h.Type != header.TypePeerReply || h.Stream != uint32(7+i) {
			t.Fatalf("reply %d: %+v %v", i, h, err)
		}
		rep, err := header.ParsePeerReply(p)
		if err != nil {
			t.Fatal(err)
		}
		want := header.PeerReply{Source: netip.MustParseAddrPort("0.0.0.0:0")}
		if i == 0 {
			want = header.PeerReply{Found: true, SiteID: 1, Source: c.LocalAddr().(*net.TCPAddr).AddrPort()}
		}
		if rep != want {
			t.Fatalf("reply %d: %+v, want %+v", i, rep, want)
		}
	}
}

// TestLinkLossAndReform: with resume off (--wan-resume-within 0), killing
// the WAN connection resets every stream on both sites within a second,
// and the mesh comes back. (With resume, TestWANResume.)
func TestLinkLossAndReform(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.ResumeWithin = 0 })
	farErr := make(chan error, 10)
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) { _, err := io.Copy(io.Discard, c); farErr <- err })
	var cs []*net.TCPConn
	for range 10 {
		c, err := lanOpen(a.LANAddr(), nodeA, dst)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("x"))
		cs = append(cs, c)
	}
	for b.allLinks()[0].NumStreams() != 10 {
		time.Sleep(5 * time.Millisecond)
	}
	old := a.allLinks()[0]
	start := time.Now()
	old.Conn().Close() // the WAN connection dies under gateway a
	for _, c := range cs {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("source after link loss: %v", err)
		}
		c.Close()
	}
	for range 10 {
		select {
		case err := <-farErr:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("destination after link loss: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("destination not reset")
		}
	}
	failed := time.Since(start)
	for !a.allUp() || !b.allUp() || a.allLinks()[0] == old {
		if time.Since(start) > 10*time.Second {
			t.Fatal("mesh did not re-form")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("streams failed on both sites in %v, mesh re-formed in %v", failed.Round(time.Microsecond), time.Since(start).Round(time.Millisecond))
	sum := testnet.Serve(t, nodeB, testnet.SumServer)
	c, err := lanOpen(a.LANAddr(), nodeA, sum)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := testnet.SendAndCheck(c, rand.New(rand.NewPCG(5, 5)), 100<<10); err != nil {
		t.Fatalf("after re-forming: %v", err)
	}
}

// TestWANConns: with K bulk links per pair, streams are homed evenly on
// them and none on the express link.
func TestWANConns(t *testing.T) {
	_, a, _ := startPair(t, func(c *Config) { c.WANConns = 3 })
	if n := len(a.allLinks()); n != 4 {
		t.Fatalf("%d links up, want 3 bulk + 1 express", n)
	}
	hold := make(chan struct{})
	defer close(hold)
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) { <-hold; c.Close() })
	for range 9 {
		c, err := lanOpen(a.LANAddr(), nodeA, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		time.Sleep(5 * time.Millisecond) // let the stream register before the next pick
	}
	for _, l := range a.allLinks() {
		want := 3
		if l.Express() {
			want = 0
		}
		if n := l.NumStreams(); n != want {
			t.Fatalf("link %d (express %v) homes %d streams, want %d", l.Index(), l.Express(), n, want)
		}
	}
}

// TestStriping: one stream's large writes use every bulk link of the pair,
// its bytes arrive intact, and the express link carries no bulk frame.
func TestStriping(t *testing.T) {
	_, a, _ := startPair(t, func(c *Config) { c.WANConns = 3 })
	sum := testnet.Serve(t, nodeB, testnet.SumServer)
	c, err := lanOpen(a.LANAddr(), nodeA, sum)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One write of data made beforehand, as a rank sends a large message:
	// the gateway's reads never wait for it, so it is one burst.
	data := make([]byte, 24<<20)
	testnet.Fill(rand.New(rand.NewPCG(7, 7)), data)
	want := sha256.Sum256(data)
	start := time.Now()
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if got, err := io.ReadAll(c); err != nil || !bytes.Equal(got, want[:]) {
		t.Fatalf("checksum %x, want %x (%v)", got, want, err)
	}
	// Loopback hands the gateway 64 KiB reads, each a possible message: at
	// most the stream's express budget (ExpressMax per relay.ExpressFloor,
	// the loopback RTT being shorter, plus the first burst) may take the
	// express link, and only if the gateway's reads waited.
	budget := uint64(a.cfg.ExpressMax) * (uint64(time.Since(start)/relay.ExpressFloor) + 2)
	for _, l := range a.allLinks() {
		n, f := l.Stats.BytesSent.Load(), l.Stats.FramesSent.Load()
		t.Logf("link %d (express %v): %d bytes in %d frames", l.Index(), l.Express(), n, f)
		if !l.Express() && n < 2<<20 {
			t.Errorf("bulk link %d carried %d of 24 MiB: the stream was not striped", l.Index(), n)
		}
		if l.Express() && n > budget {
			t.Errorf("express link carried %d bytes in %d frames: bulk frames on it", n, f)
		}
	}
}

// TestExpressCC: the express link runs its own congestion control (CUBIC
// unless told otherwise), the bulk links the WAN one, on both gateways.
func TestExpressCC(t *testing.T) {
	for _, tc := range []struct{ express, want string }{{"reno", "reno"}, {"", "cubic"}} {
		_, a, b := startPair(t, func(c *Config) { c.WAN.CC = "bbr"; c.ExpressCC = tc.express })
		for name, g := range map[string]*testGW{"dialling a": a, "accepting b": b} {
			for _, l := range g.allLinks() {
				rc, err := l.Conn().(*net.TCPConn).SyscallConn()
				if err != nil {
					t.Fatal(err)
				}
				var cc string
				var gerr error
				rc.Control(func(fd uintptr) { cc, gerr = tcpinfo.CongestionControl(int(fd)) })
				want := "bbr"
				if l.Express() {
					want = tc.want
				}
				if gerr != nil || cc != want {
					t.Errorf("--wan-express-cc %q: %s link %d (express %v): TCP_CONGESTION %q (%v), want %q",
						tc.express, name, l.Index(), l.Express(), cc, gerr, want)
				}
			}
		}
	}
	if _, err := New(Config{Map: testMap(t), Site: "a", TuningConfig: TuningConfig{ExpressCC: "nosuchcc"}}); err == nil {
		t.Error("an unknown express congestion control was accepted")
	}
}

// neverReady fails if either gateway comes up within half a second: each
// must refuse the other's links, given as what.
func neverReady(t *testing.T, a, b *testGW, what string) {
	t.Helper()
	select {
	case <-a.Ready():
		t.Fatalf("a came up with %s", what)
	case <-b.Ready():
		t.Fatalf("b came up with %s", what)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestTrunkMismatch: gateways that disagree on the express link refuse each
// other's links with an error naming the flags, and never come up.
func TestTrunkMismatch(t *testing.T) {
	m := testMap(t)
	a := startGW(t, m, "a", nil)
	b := startGW(t, m, "b", func(c *Config) { c.Express = false })
	neverReady(t, a, b, "a peer whose express link differs")
	if _, err := b.checkHello(a.helloIn(a.mine, 0), b.peers[peerID{1, 0}], 0); err == nil || !strings.Contains(err.Error(), "--wan-express") {
		t.Fatalf("mismatched HELLO: %v", err)
	}
}

// TestTrunkPresetMismatch: a parallel gateway and a shared one, neither
// on auto, refuse each other, each naming the peer's preset and its own,
// and never come up.
func TestTrunkPresetMismatch(t *testing.T) {
	m := testMap(t)
	a := startGW(t, m, "a", func(c *Config) { applyTrunk(c, TrunkParallel, func(string) bool { return false }) })
	b := startGW(t, m, "b", nil)
	neverReady(t, a, b, "a peer of the other --wan-trunk preset")
	for _, tc := range []struct {
		self, other *testGW
		want        string
	}{
		{a, b, "peer runs --wan-trunk shared, we run --wan-trunk parallel"},
		{b, a, "peer runs --wan-trunk parallel, we run --wan-trunk shared"},
	} {
		if len(tc.self.peers) != 1 {
			t.Fatalf("%d peers", len(tc.self.peers))
		}
		for _, p := range tc.self.peers {
			_, err := tc.self.checkHello(tc.other.helloIn(tc.other.mine, 0), p, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the same --wan-trunk, or auto") {
				t.Errorf("mismatched HELLO: %v, want %q", err, tc.want)
			}
		}
	}
}

// TestWANPace: every bulk WAN socket of the pair, dialled or accepted,
// carries its share of --wan-pace as SO_MAX_PACING_RATE; the express link
// is not capped.
func TestWANPace(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.WANConns = 2; c.WANPace = 160e6 })
	for name, g := range map[string]*testGW{"dialling a": a, "accepting b": b} {
		links := g.allLinks()
		if len(links) != 3 {
			t.Fatalf("%s: %d links, want 2 bulk + 1 express", name, len(links))
		}
		for _, l := range links {
			rc, err := l.Conn().(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var rate uint64
			var gerr error
			rc.Control(func(fd uintptr) {
				var v int
				v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
				rate = uint64(uint32(v))
			})
			// 160 Mbit/s over 2 links: 10 MB/s each; unlimited reads as ~0.
			want := uint64(10e6)
			if l.Express() {
				want = uint64(^uint32(0))
			}
			if gerr != nil || rate != want {
				t.Errorf("%s link %d: SO_MAX_PACING_RATE %d (%v), want %d", name, l.Index(), rate, gerr, want)
			}
		}
	}
	if _, err := New(Config{Map: testMap(t), Site: "a", WANConfig: WANConfig{WANConns: 4, WANPace: 20000}}); err == nil ||
		!strings.Contains(err.Error(), "--wan-pace") {
		t.Errorf("a pace below 8 kbit/s per link: %v", err)
	}
}

// TestQueueControl: with queue control on, the sending gateway's bulk link
// caps the peer's receive window while it saturates, and the peer's
// socket carries that cap (TCP_WINDOW_CLAMP). Loopback has no bottleneck
// queue to speak of, so the target is set below what loopback shows. Nor
// does loopback hold bytes back: pacing the link plays the WAN's part, so
// its socket has bytes waiting to be sent, as a saturated WAN link's has.
// (A stream writes its chunks itself while the link is idle, so unpaced
// the link looks backlogged only while a write is under way.) Once the
// cap (a few segments, here) holds, the stream crawls at a window per
// delayed ACK, so writes get a deadline and the loop keeps to its own.
func TestQueueControl(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.WANQueue = time.Microsecond; c.Express = false; c.WANPace = 400e6 })
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	// Queue control caps a transfer after 1 s of saturation; the rest is
	// room for a machine the race detector and other packages load.
	deadline := time.Now().Add(10 * time.Second)
	var sent, applied uint32
	for time.Now().Before(deadline) {
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Write(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
		la, lb := a.allLinks(), b.allLinks()
		if len(la) == 0 || len(lb) == 0 {
			continue
		}
		sent, applied = la[0].Stats.Clamp.Load(), lb[0].Stats.PeerClamp.Load()
		if sent != 0 && applied != 0 {
			break
		}
	}
	if sent == 0 || applied == 0 {
		t.Fatalf("no cap after 10 s of bulk: a asks %d, b applied %d", sent, applied)
	}
	rc, _ := b.allLinks()[0].Conn().(*net.TCPConn).SyscallConn()
	var v int
	rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) })
	if v < 2048 || v > 1<<30 {
		t.Fatalf("b's socket TCP_WINDOW_CLAMP %d after CLAMP %d", v, applied)
	}
	t.Logf("a asks a cap of %d bytes (queue %v), b applied %d, its socket's clamp %d",
		sent, time.Duration(a.allLinks()[0].Stats.QueueDelay.Load()), applied, v)
}

// TestDrain: on shutdown, open streams get the drain timeout, then reset.
func TestDrainAndReadyFile(t *testing.T) {
	dir := t.TempDir()
	m := testMap(t)
	maddr := netip.AddrPortFrom(gwA, freePort(t, gwA)).String()
	a := startGW(t, m, "a", func(c *Config) {
		c.ReadyFile = dir + "/ready"
		c.DrainTimeout = 300 * time.Millisecond
		c.MetricsAddr = maddr
	})
	get := func(path string) (int, string) {
		for i := 0; ; i++ {
			r, err := http.Get("http://" + maddr + path)
			if err == nil {
				b, _ := io.ReadAll(r.Body)
				r.Body.Close()
				return r.StatusCode, string(b)
			}
			if i > 100 {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if code, _ := get("/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready before the peer is up: %d", code)
	}
	if code, _ := get("/ready?primed=0"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready?primed=0 before the peer is up: %d", code)
	}
	startGW(t, m, "b", nil)
	<-a.Ready()
	if b, err := os.ReadFile(dir + "/ready"); err != nil || !strings.HasPrefix(string(b), "ready a") {
		t.Fatalf("ready file: %q %v", b, err)
	}
	if code, _ := get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready with the mesh up: %d", code)
	}
	// A link being primed: not ready, unless the asker takes links up
	// without priming done (?primed=0).
	a.peersMu.Lock()
	a.priming++
	a.peersMu.Unlock()
	if code, _ := get("/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready while a link is primed: %d", code)
	}
	if code, body := get("/ready?primed=0"); code != http.StatusOK {
		t.Errorf("/ready?primed=0 while a link is primed, every link up: %d %s", code, body)
	}
	a.peersMu.Lock()
	a.priming--
	a.peersMu.Unlock()
	_, body := get("/metrics")
	for _, want := range []string{`mpi5k_wan_link_up{link="0",peer="b",site="a"} 1`, "mpi5k_wan_tcp_cwnd_segments", "mpi5k_window_stalls_total", `mpi5k_lan_refused_total{site="a"} 0`,
		`mpi5k_wan_frames_poll_thread_total{dir="rx",link="0",peer="b",site="a"}`, "mpi5k_wan_poll_thread_partial_writes_total", "mpi5k_wan_frames_inline_total",
		`mpi5k_wan_window_clamp_bytes{link="0",peer="b",site="a"} 0`, "mpi5k_wan_peer_window_clamp_bytes", "mpi5k_wan_queue_delay_seconds",
		`mpi5k_wan_clamp_lifts_total{link="0",peer="b",site="a"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) { io.Copy(io.Discard, c) })
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("x"))
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	a.stop()
	expectReset(t, c, "stream at shutdown")
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("gateway did not stop")
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Fatalf("stopped after %v, want about the drain timeout", d)
	}
}

func TestConfigErrors(t *testing.T) {
	if err := tuning.CheckCC("no-such-cc"); err == nil || !strings.Contains(err.Error(), "not offered by this kernel") {
		t.Errorf("CheckCC: %v", err)
	}
	if _, err := New(Config{Map: testMap(t), Site: "nowhere"}); err == nil {
		t.Error("unknown site accepted")
	}
	if _, err := New(Config{Map: testMap(t), Site: "a", TuningConfig: TuningConfig{Chunk: 2 << 20}}); err == nil {
		t.Error("chunk above 1 MiB accepted")
	}
	if _, err := New(Config{Map: testMap(t), Site: "a", LimitsConfig: LimitsConfig{MaxPeerStreams: -1}}); err == nil || !strings.Contains(err.Error(), "MaxPeerStreams") {
		t.Errorf("negative limit: %v", err)
	}
	if _, err := New(Config{Map: testMap(t), Site: "a", WANConfig: WANConfig{PingInterval: -time.Second}}); err == nil || !strings.Contains(err.Error(), "PingInterval") {
		t.Errorf("negative ping interval: %v", err)
	}
}

// TestWANTimers: --wan-rto-min and --wan-delack-max reach the WAN sockets
// of both sides (dialed and accepted), and values the kernel rejects or
// negative ones fail New with the flag named.
func TestWANTimers(t *testing.T) {
	if err := (tuning.SockOpts{RTOMin: 10 * time.Millisecond}).CheckTimers(); errors.Is(err, unix.ENOPROTOOPT) {
		t.Skip("kernel without TCP_RTO_MIN_US")
	}
	_, a, b := startPair(t, func(c *Config) {
		c.WAN.RTOMin, c.WAN.DelackMax = 10*time.Millisecond, 5*time.Millisecond
	})
	seen := 0
	for _, g := range []*testGW{a, b} {
		for _, l := range g.allLinks() {
			seen++
			rc, err := l.Conn().(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var rto, delack int
			rc.Control(func(fd uintptr) {
				rto, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, tuning.TCPRTOMinUS)
				delack, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, tuning.TCPDelackMaxUS)
			})
			// The kernel rounds up to clock ticks (4 ms at HZ=250).
			if rto < 10000 || rto > 20000 || delack < 5000 || delack > 16000 {
				t.Errorf("link %d express=%v: TCP_RTO_MIN_US %d, TCP_DELACK_MAX_US %d; want about 10000 and 5000", l.Index(), l.Express(), rto, delack)
			}
		}
	}
	if seen < 4 {
		t.Fatalf("%d WAN links checked, want the bulk and express link on both sides", seen)
	}
	m := testMap(t)
	for _, c := range []struct {
		rto, delack time.Duration
		want        string
	}{{-time.Millisecond, 0, "--wan-rto-min -1ms out of range 0..200ms"}, {time.Millisecond, 0, "at most 200 ms"}, {0, time.Second, "--wan-delack-max 1s"}} {
		_, err := New(Config{Map: m, Site: "a", WANConfig: WANConfig{WAN: tuning.SockOpts{RTOMin: c.rto, DelackMax: c.delack}}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rto-min %v delack-max %v: error %v, want one with %q", c.rto, c.delack, err, c.want)
		}
	}
}

// TestExpressRenew: the express link is renewed under traffic, once at the
// dialer's initiative and once at the acceptor's (RENEW), and a ping-pong
// through the pair never notices; both gateways count the renewals, and
// the new express sockets run the express congestion control again. With
// resume (the default) the link goes on over a new connection and the old
// one is closed; without, a new link takes its place and the old retires.
func TestExpressRenew(t *testing.T) {
	t.Run("resume", func(t *testing.T) { testExpressRenew(t, time.Minute) })
	t.Run("retire", func(t *testing.T) { testExpressRenew(t, 0) })
}

func testExpressRenew(t *testing.T, resumeWithin time.Duration) {
	_, a, b := startPair(t, func(c *Config) { c.WAN.CC = "bbr"; c.ResumeWithin = resumeWithin })
	dst := testnet.Serve(t, nodeB, echoServer)
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop, failed := make(chan struct{}), make(chan error, 1)
	go func() {
		msg, got := make([]byte, 3000), make([]byte, 3000)
		for n := 0; ; n++ {
			select {
			case <-stop:
				failed <- nil
				return
			default:
			}
			for j := range msg {
				msg[j] = byte(n + j)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(msg); err != nil {
				failed <- err
				return
			}
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				failed <- fmt.Errorf("message %d: echo differs or failed: %v", n, err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	pa, pb := a.peers[peerID{2, 0}], b.peers[peerID{1, 0}]
	x := a.cfg.WANConns // the express link's index
	express := func(g *testGW, p *peer) *relay.Link {
		g.peersMu.Lock()
		defer g.peersMu.Unlock()
		return p.links[x]
	}
	waitRenewed := func(n uint64) {
		t.Helper()
		for i := 0; pa.renewed.Load() < n || pb.renewed.Load() < n; i++ {
			if i == 500 {
				t.Fatalf("renewals: a %d, b %d, want %d", pa.renewed.Load(), pb.renewed.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	old := express(a, pa)
	oldConns := []net.Conn{old.Conn(), express(b, pb).Conn()}
	for i := 0; old.Stats.BytesSent.Load() == 0; i++ {
		if i == 500 {
			t.Fatal("the express link carried no message")
		}
		time.Sleep(10 * time.Millisecond)
	}
	wanBytes := counter(t, a, "mpi5k_wan_bytes_total")
	kickRenew(pa)
	waitRenewed(1)
	// The WAN byte counters carry over a renewal: the retired link's bytes
	// stay counted.
	if n := counter(t, a, "mpi5k_wan_bytes_total"); n < wanBytes {
		t.Errorf("a's WAN bytes fell from %v to %v across a renewal", wanBytes, n)
	}
	time.Sleep(100 * time.Millisecond)
	// The acceptor asks; the dialer waits out relay.RenewGap since its last one.
	if !express(b, pb).RequestRenew(0) {
		t.Fatal("b did not send RENEW")
	}
	waitRenewed(2)
	if resumeWithin == 0 {
		select {
		case <-old.Done():
			if !errors.Is(old.Err(), relay.ErrLinkRetired) {
				t.Errorf("the first express link ended with %v", old.Err())
			}
		case <-time.After(5 * time.Second):
			t.Error("the first express link did not retire")
		}
	}
	for k, name := range []string{"a", "b"} {
		g, p := a, pa
		if name == "b" {
			g, p = b, pb
		}
		l := express(g, p)
		switch {
		case l == nil:
			t.Fatalf("%s: no express link after two renewals", name)
		case resumeWithin == 0 && l == old:
			t.Fatalf("%s: the same express link after two renewals without resume", name)
		case resumeWithin > 0 && (l.Err() != nil || name == "a" && l != old || l.ResumeStats().Renewals != 2 || l.ResumeStats().Resumes != 0):
			t.Fatalf("%s: express link %v (err %v, %+v) after two renewals by resume, want the first one renewed twice and never resumed",
				name, l, l.Err(), l.ResumeStats())
		case resumeWithin > 0:
			if _, err := oldConns[k].Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
				t.Errorf("%s: the express link's first connection is still open after its renewal: write %v", name, err)
			}
		}
		var cc string
		rc, _ := l.Conn().(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) { cc, _ = tcpinfo.CongestionControl(int(fd)) })
		if cc != "cubic" {
			t.Errorf("%s: renewed express link runs %q, want cubic", name, cc)
		}
	}
	close(stop)
	if err := <-failed; err != nil {
		t.Fatalf("ping-pong across the renewals: %v", err)
	}
	if n := pa.renewed.Load(); n != 2 {
		t.Errorf("a renewed %d times, want 2", n)
	}
}

// TestPrime: by the time a gateway reports ready it has filled every new
// BBR WAN link with PAD frames (and no CUBIC one), in both directions;
// --wan-prime=false sends none.
func TestPrime(t *testing.T) {
	if tuning.CheckCC("bbr") != nil {
		t.Skip("no bbr congestion control on this kernel")
	}
	for _, tc := range []struct {
		name    string
		express string
		off     bool
		bulk, x bool // padded
	}{
		{"bbr express", "bbr", false, true, true},
		{"cubic express", "cubic", false, true, false},
		{"off", "bbr", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a, b := startPair(t, func(c *Config) { c.WAN.CC, c.ExpressCC, c.Prime = "bbr", tc.express, !tc.off })
			for _, g := range []*testGW{a, b} {
				g.peersMu.Lock()
				priming := g.priming
				g.peersMu.Unlock()
				if priming != 0 {
					t.Errorf("%s ready with %d links priming", g.site.Name, priming)
				}
				links := g.allLinks()
				if len(links) != 2 {
					t.Fatalf("%s: %d links, want 2", g.site.Name, len(links))
				}
				for _, l := range links {
					want := tc.bulk
					if l.Express() {
						want = tc.x
					}
					if sent := l.Stats.PadSent.Load(); (sent > 0) != want {
						t.Errorf("%s link %d (express %v): %d PAD bytes sent by ready, want padded=%v", g.site.Name, l.Index(), l.Express(), sent, want)
					}
				}
			}
		})
	}
}
