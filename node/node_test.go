package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
)

var (
	nodeAddr = netip.MustParseAddr("127.0.0.1")
	gwLAN    = netip.MustParseAddrPort("10.9.0.1:4000")
)

// endpoint starts an MX engine on link and opens the gateways' endpoint
// number on it; the engine closes when the test ends.
func endpoint(t testing.TB, link mx.Link, cfg mx.Config) *mx.Endpoint {
	t.Helper()
	e, err := mx.New(link, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ep, err := e.Open(mxlan.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// lan starts a node daemon and a gateway-side MX transport on one
// in-memory Ethernet with the loss given.
func lan(t *testing.T, loss float64) (*Daemon, *gateway.MXTransport) {
	hub := mx.NewMemHub(1500)
	if loss > 0 {
		hub.Fault = mx.RandomFault(3, loss, 0, 0.01)
	}
	var eps []*mx.Endpoint
	for _, mac := range []mx.MAC{{2, 0, 0, 0, 9, 1}, {2, 0, 0, 0, 9, 2}} {
		eps = append(eps, endpoint(t, hub.Attach(mac), mx.Config{}))
	}
	d := startDaemon(t, Config{Addr: nodeAddr, NoResume: true, Listen: netip.MustParseAddrPort("127.0.0.2:0"),
		Gateways: []Gateway{{LAN: gwLAN, MX: eps[0].Addr()}}, EP: eps[1], MaxConns: 64})
	tr := &gateway.MXTransport{EP: eps[0], Resolve: func(a netip.Addr) (mx.Addr, error) {
		return eps[1].Addr(), nil
	}}
	return d, tr
}

// startDaemon runs a daemon of cfg until the test ends.
func startDaemon(t testing.TB, cfg Config) *Daemon {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

func addrPort(a net.Addr) netip.AddrPort {
	ap := a.(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// TestFromRank: a rank's connection with OPEN reaches the gateway as a
// stream whose metadata and OPEN name the node's address and the rank's
// port, and carries the bytes both ways, ends included; over a lossy LAN.
func TestFromRank(t *testing.T) {
	d, tr := lan(t, 0.01)
	ln, err := tr.Listen(gwLAN)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dst := netip.MustParseAddrPort("10.8.0.5:7000")
	for i := range 5 {
		c, err := net.Dial("tcp", d.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		src := addrPort(c.LocalAddr())
		body, _ := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Label: "test"})
		payload := make([]byte, 300<<10+i)
		r := rand.New(rand.NewPCG(uint64(i), 1))
		for j := range payload {
			payload[j] = byte(r.Uint32())
		}
		go func() {
			c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
			c.Write(payload)
			c.(*net.TCPConn).CloseWrite()
		}()
		g, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		want := netip.AddrPortFrom(nodeAddr, src.Port())
		if g.Remote() != want {
			t.Errorf("stream from %v, want %v", g.Remote(), want)
		}
		h, b, err := header.ReadOne(g, header.MaxPayload)
		if err != nil || h.Type != header.TypeOpen {
			t.Fatalf("first frame %v: %v", h.Type, err)
		}
		o, err := header.ParseOpen(b)
		if err != nil || o.Src != want || o.Dst != dst || o.Label != "test" {
			t.Fatalf("OPEN %+v, %v; want source %v", o, err, want)
		}
		got, err := io.ReadAll(g)
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("stream %d: %d bytes of %d, %v", i, len(got), len(payload), err)
		}
		sum := sha256.Sum256(got)
		g.Write(sum[:])
		g.CloseWrite()
		back, err := io.ReadAll(c)
		if err != nil || !bytes.Equal(back, sum[:]) {
			t.Fatalf("reply: %x, %v", back, err)
		}
		c.Close()
		g.Close()
	}
}

// TestFromGateway: a stream the gateway opens reaches the rank's port from
// the daemon's address, and the rank's PEER_QUERY about it reaches the
// gateway in the gateway's terms.
func TestFromGateway(t *testing.T) {
	d, tr := lan(t, 0)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	gl, err := tr.Listen(gwLAN)
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	dst := addrPort(rl.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var gwEnd netip.AddrPort
	s, err := tr.Dial(ctx, gwLAN.Addr(), dst, header.ResumeID{}, func(ap netip.AddrPort) { gwEnd = ap })
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("hello"))
	r, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	seen := addrPort(r.RemoteAddr())
	if seen.Addr() != d.Addr().Addr() {
		t.Errorf("rank sees %v, want the daemon's address %v", seen, d.Addr().Addr())
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("rank read %q, %v", buf, err)
	}
	// The rank's control connection: PEER_QUERY about r.
	cc, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	q := header.AppendPeerQuery(nil, &header.PeerQuery{Seen: seen, Local: addrPort(r.LocalAddr())})
	cc.Write(header.AppendFrame(nil, header.TypePeerQuery, 7, q))
	g, err := gl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	h, b, err := header.ReadOne(g, header.MaxControl)
	if err != nil || h.Type != header.TypePeerQuery || h.Stream != 7 {
		t.Fatalf("control frame %v %d: %v", h.Type, h.Stream, err)
	}
	pq, err := header.ParsePeerQuery(b)
	if err != nil || pq.Seen != gwEnd || pq.Local != dst {
		t.Fatalf("PEER_QUERY %+v, %v; want seen %v local %v", pq, err, gwEnd, dst)
	}
	rep := header.AppendPeerReply(nil, &header.PeerReply{Found: true, SiteID: 2, Source: netip.MustParseAddrPort("10.8.0.5:999")})
	g.Write(header.AppendFrame(nil, header.TypePeerReply, 7, rep))
	rr := header.NewReader(cc, 256)
	var fb [64]byte
	h, _, err = rr.ReadFrame(fb[:])
	if err != nil || h.Type != header.TypePeerReply || h.Stream != 7 {
		t.Fatalf("reply %v %d: %v", h.Type, h.Stream, err)
	}
	// Ends pass both ways.
	r.Write([]byte("bye"))
	r.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "bye" {
		t.Fatalf("gateway read %q, %v", got, err)
	}
	s.CloseWrite()
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("rank after the gateway's end: %q, %v", rest, err)
	}
}

// TestBadFirstFrame: a connection whose first frame is not one a rank
// sends, or whose OPEN names another source, is reset.
func TestBadFirstFrame(t *testing.T) {
	d, _ := lan(t, 0)
	for _, f := range [][]byte{
		header.AppendFrame(nil, header.TypePeerReply, 1, nil),
		func() []byte {
			body, _ := header.AppendOpen(nil, &header.Open{Dst: netip.MustParseAddrPort("10.8.0.5:7000"), Src: netip.MustParseAddrPort("127.0.0.1:1")})
			return header.AppendFrame(nil, header.TypeOpen, 0, body)
		}(),
	} {
		c, err := net.Dial("tcp", d.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(f)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err == nil {
			t.Errorf("frame %x: connection ended cleanly, want a reset", f[:4])
		}
		c.Close()
	}
}
