package shimtest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/sitemap"
)

// fakeGW plays every site's gateway in one process, with the LAN protocol of
// docs/wire-format.md (OPEN, PEER_QUERY) but no WAN: a stream opened at site
// X's LAN listener is connected straight to its destination from site Y's
// LAN address, exactly as Y's gateway would, and recorded for PEER_QUERY.
// It stands in for bin/mpi5k-gateway so the shim can be tested alone.
type fakeGW struct {
	t     *testing.T
	m     *sitemap.Map
	lns   []net.Listener
	mu    sync.Mutex
	peers map[[2]netip.AddrPort]netip.AddrPort // (gateway end, rank end) -> true source
	// listens: host:ports registered (LISTEN) on control connections
	// still open.
	listens map[netip.AddrPort]int
	wg      sync.WaitGroup

	opens, refused, queries, found atomic.Int64
	queriesElsewhere               atomic.Int64 // PEER_QUERYs sent to a gateway other than the one the connection came from
	// opensAt, listensAt: OPENs and LISTENs per LAN listener (a site's
	// gateway hosts).
	opensAt, listensAt map[netip.AddrPort]*atomic.Int64
	lnAt               map[netip.AddrPort]net.Listener
	bytes              atomic.Int64 // application bytes relayed, both directions
	badSrc             atomic.Int64 // OPENs whose source is not in the listener's site
}

func startFakeGW(t *testing.T, m *sitemap.Map) *fakeGW {
	g := &fakeGW{t: t, m: m, peers: map[[2]netip.AddrPort]netip.AddrPort{}, listens: map[netip.AddrPort]int{},
		opensAt: map[netip.AddrPort]*atomic.Int64{}, listensAt: map[netip.AddrPort]*atomic.Int64{}, lnAt: map[netip.AddrPort]net.Listener{}}
	for _, s := range m.Sites() {
		for i, gw := range s.Gateways {
			ln, err := net.Listen("tcp", gw.LAN.String())
			if err != nil {
				t.Fatalf("fake gateway of site %s: %v", s.Name, err)
			}
			g.lns = append(g.lns, ln)
			g.opensAt[gw.LAN], g.listensAt[gw.LAN] = new(atomic.Int64), new(atomic.Int64)
			g.lnAt[gw.LAN] = ln
			g.wg.Add(1)
			go g.serve(ln, s, i, g.opensAt[gw.LAN], g.listensAt[gw.LAN])
		}
	}
	t.Cleanup(g.close)
	return g
}

func (g *fakeGW) close() {
	for _, ln := range g.lns {
		ln.Close()
	}
}

func (g *fakeGW) serve(ln net.Listener, site *sitemap.Site, gw int, opens, listens *atomic.Int64) {
	defer g.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go g.handle(c.(*net.TCPConn), site, gw, opens, listens)
	}
}

func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// handle serves a connection to gateway gw of site.
func (g *fakeGW) handle(c *net.TCPConn, site *sitemap.Site, gw int, opens, listens *atomic.Int64) {
	h, p, err := header.ReadOne(c, header.MaxPayload)
	if err != nil {
		reset(c)
		return
	}
	switch h.Type {
	case header.TypeOpen:
		opens.Add(1)
		g.open(c, site, gw, p)
	case header.TypePeerQuery, header.TypeListen:
		g.control(c, h, p, site.Gateways[gw].LAN.Addr(), listens)
	default:
		reset(c)
	}
}

// control answers PEER_QUERY and LISTEN until the rank closes c; its
// registrations end then.
// control serves a control connection to the gateway whose LAN address
// is at.
func (g *fakeGW) control(c *net.TCPConn, h header.Header, p []byte, at netip.Addr, listens *atomic.Int64) {
	host := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	var mine []netip.AddrPort
	defer func() {
		g.mu.Lock()
		for _, ap := range mine {
			if g.listens[ap]--; g.listens[ap] == 0 {
				delete(g.listens, ap)
			}
		}
		g.mu.Unlock()
		c.Close()
	}()
	for {
		var reply []byte
		switch h.Type {
		case header.TypePeerQuery:
			q, err := header.ParsePeerQuery(p)
			if err != nil {
				reset(c)
				return
			}
			g.queries.Add(1)
			if q.Seen.Addr().Unmap() != at {
				g.queriesElsewhere.Add(1) // not the gateway that dialed the connection
			}
			g.mu.Lock()
			src, ok := g.peers[[2]netip.AddrPort{q.Seen, q.Local}]
			g.mu.Unlock()
			r := header.PeerReply{Found: ok, Source: src}
			if ok {
				g.found.Add(1)
				if s, ok := g.m.Lookup(src.Addr()); ok {
					r.SiteID = s.ID
				}
			}
			reply = header.AppendFrame(nil, header.TypePeerReply, h.Stream, header.AppendPeerReply(nil, &r))
		case header.TypeListen:
			port, err := header.ParseListen(p)
			if err != nil {
				reset(c)
				return
			}
			ap := netip.AddrPortFrom(host, port)
			listens.Add(1)
			g.mu.Lock()
			g.listens[ap]++
			g.mu.Unlock()
			mine = append(mine, ap)
			reply = header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOK})
		default:
			reset(c)
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
		var err error
		if h, p, err = header.ReadOne(c, header.MaxPayload); err != nil {
			return
		}
	}
}

// registered reports whether port is registered (LISTEN) from any host:
// on loopback the control connection's source is 127.0.0.1, not the
// rank's address as on a LAN.
func (g *fakeGW) registered(port uint16) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ap, n := range g.listens {
		if ap.Port() == port && n > 0 {
			return true
		}
	}
	return false
}

// open relays an OPEN received by gateway gw of site: the destination
// site's gateway of the same index (or its last) connects, as the real
// ones spread streams over the far site's gateways.
func (g *fakeGW) open(c *net.TCPConn, site *sitemap.Site, gw int, p []byte) {
	o, err := header.ParseOpen(p)
	if err != nil {
		reset(c)
		return
	}
	g.opens.Add(1)
	if s, ok := g.m.Lookup(o.Src.Addr()); !ok || s != site {
		g.badSrc.Add(1)
		reset(c)
		return
	}
	dsite, ok := g.m.Lookup(o.Dst.Addr())
	if !ok || dsite == site {
		g.refused.Add(1)
		reset(c)
		return
	}
	out, err := g.dialFrom(dsite.Gateways[min(gw, len(dsite.Gateways)-1)].LAN.Addr(), o.Dst, o.Src)
	if err != nil {
		g.refused.Add(1)
		reset(c)
		return
	}
	var wg sync.WaitGroup
	pipe := func(dst, src *net.TCPConn) {
		defer wg.Done()
		n, err := io.Copy(dst, src)
		g.bytes.Add(n)
		if err != nil {
			reset(dst)
			reset(src)
			return
		}
		dst.CloseWrite()
	}
	wg.Add(2)
	go pipe(out, c)
	go pipe(c, out)
	wg.Wait()
	c.Close()
	out.Close()
}

// dialFrom connects to dst from local:0, recording (local end, dst) -> src
// before connect() as the far gateway must, so the destination's peer query
// can never arrive first.
func (g *fakeGW) dialFrom(local netip.Addr, dst, src netip.AddrPort) (*net.TCPConn, error) {
	sockaddr := func(a netip.AddrPort) unix.Sockaddr {
		if a.Addr().Is4() {
			return &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())}
		}
		return &unix.SockaddrInet6{Addr: a.Addr().As16(), Port: int(a.Port())}
	}
	family := unix.AF_INET
	if !local.Is4() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(local, 0))); err != nil {
		unix.Close(fd)
		return nil, err
	}
	var port int
	switch sa, _ := unix.Getsockname(fd); sa := sa.(type) {
	case *unix.SockaddrInet4:
		port = sa.Port
	case *unix.SockaddrInet6:
		port = sa.Port
	}
	me := netip.AddrPortFrom(local, uint16(port))
	key := [2]netip.AddrPort{me, dst}
	g.mu.Lock()
	g.peers[key] = src
	g.mu.Unlock()
	if err := unix.Connect(fd, sockaddr(dst)); err != nil {
		unix.Close(fd)
		g.mu.Lock()
		delete(g.peers, key)
		g.mu.Unlock()
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "out")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// echoServer is a plain (unshimmed) echo server with half-close.
func echoServer(t *testing.T, addr string) (port int, accepted *atomic.Int64) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func(c *net.TCPConn) {
				io.Copy(c, c)
				c.CloseWrite()
				c.Close()
			}(c.(*net.TCPConn))
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// loopbackMap writes a two-site map on loopback: site a = 127.0.1.0/24 with
// its gateway at 127.0.1.254, site b = 127.0.2.0/24 at 127.0.2.254. Ports are
// picked free.
func loopbackMap(t *testing.T, dir string) (string, *sitemap.Map) {
	pa, pb := freePort(t, "127.0.1.254"), freePort(t, "127.0.2.254")
	return writeMap(t, dir, fmt.Sprintf(`site a id=1 lan=127.0.1.254:%d wan=127.0.1.253:7001
net a 127.0.1.0/24
site b id=2 lan=127.0.2.254:%d wan=127.0.2.253:7001
net b 127.0.2.0/24
`, pa, pb))
}

// twoGatewayMap is loopbackMap with a second gateway host for each site
// (LAN 127.0.1.252, 127.0.2.252).
func twoGatewayMap(t *testing.T, dir string) (string, *sitemap.Map) {
	pa, pa2 := freePort(t, "127.0.1.254"), freePort(t, "127.0.1.252")
	pb, pb2 := freePort(t, "127.0.2.254"), freePort(t, "127.0.2.252")
	return writeMap(t, dir, fmt.Sprintf(`site a id=1 lan=127.0.1.254:%d wan=127.0.1.253:7001
gateway a lan=127.0.1.252:%d wan=127.0.1.251:7001
net a 127.0.1.0/24
site b id=2 lan=127.0.2.254:%d wan=127.0.2.253:7001
gateway b lan=127.0.2.252:%d wan=127.0.2.251:7001
net b 127.0.2.0/24
`, pa, pa2, pb, pb2))
}

func writeMap(t *testing.T, dir, text string) (string, *sitemap.Map) {
	path := dir + "/map.conf"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := sitemap.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, m
}

func freePort(t *testing.T, ip string) int {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
