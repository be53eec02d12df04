package gateway

import (
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// listenConn opens a control connection from src to the gateway at gw.
func listenConn(t *testing.T, gw netip.AddrPort, src netip.Addr) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", gw.String())
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// register sends LISTEN port with request id on c and returns the code of
// the answer.
func register(t *testing.T, c *net.TCPConn, id uint32, port uint16) uint8 {
	t.Helper()
	if _, err := c.Write(header.AppendFrame(nil, header.TypeListen, id, header.AppendListen(nil, port))); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, body, err := header.ReadOne(c, 64)
	if err != nil {
		t.Fatal(err)
	}
	if h.Type != header.TypeListenReply || h.Stream != id || len(body) != 1 {
		t.Fatalf("LISTEN answered by %v id %d body % x", h.Type, h.Stream, body)
	}
	return body[0]
}

// refusedStream reports whether a stream from site a to dst is refused:
// the connection ends without a byte of the destination's answer.
func refusedStream(t *testing.T, a *testGW, dst netip.AddrPort) bool {
	t.Helper()
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("x"))
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _ := io.Copy(io.Discard, c)
	return n == 0
}

// TestListenPolicy: with no --wan-allow-ports, a stream from another site
// reaches a host:port only while a control connection from that host has
// registered the port (LISTEN); the same port of another host stays shut;
// privileged ports are never registered; closing the connection ends its
// registrations.
func TestListenPolicy(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.AllowPorts = nil })
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	other := netip.AddrPortFrom(netip.MustParseAddr("127.2.0.11"), dst.Port())
	if !refusedStream(t, a, dst) {
		t.Fatal("a stream reached an unregistered port")
	}
	if n := refusedFor(t, b, "dst_port"); n != 1 {
		t.Fatalf("dst_port refusals %v, want 1", n)
	}

	ctl := listenConn(t, b.LANAddr(), nodeB)
	if code := register(t, ctl, 1, dst.Port()); code != header.ListenOK {
		t.Fatalf("LISTEN %d answered %d", dst.Port(), code)
	}
	if code := register(t, ctl, 2, 22); code != header.ListenPrivileged {
		t.Errorf("LISTEN 22 answered %d, want %d (privileged)", code, header.ListenPrivileged)
	}
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := testnet.SendAndCheck(c, mrand.New(mrand.NewPCG(1, 1)), 1<<20); err != nil {
		t.Fatalf("a stream to the registered port: %v", err)
	}
	c.Close()
	if !refusedStream(t, a, other) {
		t.Error("a stream reached the registered port of another host")
	}
	if g := b.listens.n.Load(); g != 1 {
		t.Errorf("mpi5k_rank_listeners %d, want 1", g)
	}

	ctl.Close()
	deadline := time.Now().Add(5 * time.Second)
	for b.listens.n.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !refusedStream(t, a, dst) {
		t.Error("a stream reached the port after its registering connection closed")
	}
	if n := refusedFor(t, b, "dst_port"); n != 3 {
		t.Errorf("dst_port refusals %v, want 3", n)
	}
	if n := refusedFor(t, b, "listen_privileged"); n != 1 {
		t.Errorf("listen_privileged refusals %v, want 1", n)
	}
}

// A node of another site cannot register: its control connection is
// refused as every LAN connection from outside the site.
func TestListenFromOtherSite(t *testing.T) {
	_, _, b := startPair(t, func(c *Config) { c.AllowPorts = nil })
	// The gateway resets a connection from another site's node as soon as
	// it accepts it, which on loopback can beat connect's return: a reset
	// dial is the refusal too.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: nodeA.AsSlice()}}
	c, err := d.Dial("tcp", b.LANAddr().String())
	if errors.Is(err, syscall.ECONNRESET) {
		if n := b.listens.n.Load(); n != 0 {
			t.Errorf("%d ports registered", n)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	ctl := c.(*net.TCPConn)
	defer ctl.Close()
	ctl.Write(header.AppendFrame(nil, header.TypeListen, 1, header.AppendListen(nil, 40000)))
	ctl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := header.ReadOne(ctl, 64); err == nil {
		t.Fatal("a node of site a registered a port with site b's gateway")
	}
	if n := b.listens.n.Load(); n != 0 {
		t.Errorf("%d ports registered", n)
	}
}

// TestListenPorts: a node's user registers a port where another user's
// service listens (8022, outside the ephemeral range): the gateway cannot
// see who holds it, so it refuses every port outside --lan-listen-ports,
// and the service stays out of reach of other sites; a rank's listener
// on a kernel-chosen port is registered and reached. A narrower
// --lan-listen-ports refuses that port too.
func TestListenPorts(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.AllowPorts = nil })
	service := netip.AddrPortFrom(nodeB, 8022)
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(service))
	if err != nil {
		t.Skipf("port 8022 of %v: %v", nodeB, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go testnet.SumServer(c)
		}
	}()
	rank := testnet.Serve(t, nodeB, testnet.SumServer) // port 0: the kernel's ephemeral range
	if !DefaultListenPorts.Has(rank.Port()) {
		t.Skipf("this host's ip_local_port_range gave %d, outside %v", rank.Port(), DefaultListenPorts)
	}

	ctl := listenConn(t, b.LANAddr(), nodeB)
	defer ctl.Close()
	if code := register(t, ctl, 1, service.Port()); code != header.ListenPort {
		t.Errorf("LISTEN %d answered %d, want %d (outside --lan-listen-ports)", service.Port(), code, header.ListenPort)
	}
	if !refusedStream(t, a, service) {
		t.Error("a stream from another site reached the service on port 8022")
	}
	if n := refusedFor(t, b, "listen_port"); n != 1 {
		t.Errorf("listen_port refusals %v, want 1", n)
	}
	if code := register(t, ctl, 2, rank.Port()); code != header.ListenOK {
		t.Fatalf("LISTEN %d answered %d", rank.Port(), code)
	}
	c, err := lanOpen(a.LANAddr(), nodeA, rank)
	if err != nil {
		t.Fatal(err)
	}
	if err := testnet.SendAndCheck(c, mrand.New(mrand.NewPCG(2, 2)), 1<<16); err != nil {
		t.Fatalf("a stream to the rank's registered port: %v", err)
	}
	c.Close()

	_, _, narrow := startPair(t, func(c *Config) { c.AllowPorts, c.ListenPorts = nil, PortSet{{rank.Port() + 1, 65535}} })
	nctl := listenConn(t, narrow.LANAddr(), nodeB)
	defer nctl.Close()
	if code := register(t, nctl, 1, rank.Port()); code != header.ListenPort {
		t.Errorf("LISTEN %d with --lan-listen-ports %v answered %d, want %d", rank.Port(), narrow.cfg.ListenPorts, code, header.ListenPort)
	}
}
