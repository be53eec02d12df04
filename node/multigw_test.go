package node

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
)

var gwLAN2 = netip.MustParseAddrPort("10.9.0.2:4000")

// twoGateways starts a node daemon whose site has two gateways, each with
// an MX engine of its own on one in-memory Ethernet, and returns the
// daemon and the gateways' transports. With dead, the second gateway's
// MAC has no host behind it: frames to it are lost.
func twoGateways(t *testing.T, dead bool, dialTimeout time.Duration) (*Daemon, []*gateway.MXTransport, *mx.MemHub) {
	hub := mx.NewMemHub(1500)
	open := func(mac mx.MAC) *mx.Endpoint { return endpoint(t, hub.Attach(mac), mx.Config{}) }
	nodeEP := open(mx.MAC{2, 0, 0, 0, 9, 2})
	var trs []*gateway.MXTransport
	gws := []Gateway{{LAN: gwLAN}, {LAN: gwLAN2}}
	for i, mac := range []mx.MAC{{2, 0, 0, 0, 9, 1}, {2, 0, 0, 0, 9, 3}} {
		if i == 1 && dead {
			gws[i].MX = mx.Addr{MAC: mac, EP: mxlan.Endpoint}
			continue
		}
		ep := open(mac)
		gws[i].MX = ep.Addr()
		trs = append(trs, &gateway.MXTransport{EP: ep, Resolve: func(netip.Addr) (mx.Addr, error) { return nodeEP.Addr(), nil }})
	}
	d := startDaemon(t, Config{Addr: nodeAddr, NoResume: true, Listen: netip.MustParseAddrPort("127.0.0.2:0"),
		Gateways: gws, EP: nodeEP, MaxConns: 64, DialTimeout: dialTimeout})
	return d, trs, hub
}

// echoGateway accepts the streams of gateway tr on its LAN address lan:
// for a stream with OPEN it sends idx on got and echoes the rest; a
// control stream gets OK for every LISTEN.
func echoGateway(t *testing.T, tr *gateway.MXTransport, lan netip.AddrPort, idx int, got chan<- int) {
	ln, err := tr.Listen(lan)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					h, _, err := header.ReadOne(c, header.MaxPayload)
					switch {
					case err != nil:
						return
					case h.Type == header.TypeListen:
						c.Write(header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOK}))
						continue
					case h.Type == header.TypeOpen:
						got <- idx
						io.Copy(c, c)
					default:
						c.Abort()
					}
					return
				}
			}()
		}
	}()
}

// rankOpen connects a rank to the daemon, sends OPEN and a ping, and
// waits for the echo.
func rankOpen(t *testing.T, d *Daemon) {
	t.Helper()
	c, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body, _ := header.AppendOpen(nil, &header.Open{Dst: netip.MustParseAddrPort("10.8.0.5:7000"), Src: addrPort(c.LocalAddr())})
	c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
	c.Write([]byte("ping"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ping" {
		t.Fatalf("echo through the daemon: %q, %v", b, err)
	}
}

// TestSpreadOverGateways: a rank's new connections alternate between the
// site's two gateways, each stream naming its own gateway's LAN address
// (the gateway's listener resets any other).
func TestSpreadOverGateways(t *testing.T) {
	d, trs, _ := twoGateways(t, false, 0)
	got := make(chan int, 16)
	echoGateway(t, trs[0], gwLAN, 0, got)
	echoGateway(t, trs[1], gwLAN2, 1, got)
	var n [2]int
	for range 8 {
		rankOpen(t, d)
		n[<-got]++
	}
	if n[0] != 4 || n[1] != 4 {
		t.Errorf("streams per gateway %v, want 4 and 4 (round robin)", n)
	}
}

// TestSecondGatewayStream: a stream the site's second gateway opens
// reaches the rank; the rank's PEER_QUERY about it goes to that gateway,
// naming its end with that gateway's LAN address, not to the first; a
// LISTEN reaches both gateways and is answered once. A stream from an
// endpoint that is no gateway of the site is refused.
func TestSecondGatewayStream(t *testing.T) {
	d, trs, hub := twoGateways(t, false, 0)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	var gls []gateway.LANListener
	for i, lan := range []netip.AddrPort{gwLAN, gwLAN2} {
		gl, err := trs[i].Listen(lan)
		if err != nil {
			t.Fatal(err)
		}
		defer gl.Close()
		gls = append(gls, gl)
	}
	dst := addrPort(rl.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var gwEnd netip.AddrPort
	s, err := trs[1].Dial(ctx, gwLAN2.Addr(), dst, header.ResumeID{}, func(ap netip.AddrPort) { gwEnd = ap })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("hello"))
	r, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("rank read %q, %v", buf, err)
	}

	// The gateways' ends of the rank's control connection: each answers
	// what it is asked and reports it.
	type asked struct {
		gw   int
		h    header.Header
		body []byte
	}
	seen := make(chan asked, 16)
	for i, gl := range gls {
		go func() {
			for {
				g, err := gl.Accept()
				if err != nil {
					return
				}
				go func() {
					defer g.Close()
					for {
						h, b, err := header.ReadOne(g, header.MaxControl)
						if err != nil {
							return
						}
						seen <- asked{i, h, b}
						var rep []byte
						if h.Type == header.TypeListen {
							rep = header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOK})
						} else {
							rep = header.AppendFrame(nil, header.TypePeerReply, h.Stream, header.AppendPeerReply(nil,
								&header.PeerReply{Found: true, SiteID: uint8(2 + i), Source: netip.MustParseAddrPort("10.8.0.5:999")}))
						}
						if _, err := g.Write(rep); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
	cc, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rr := header.NewReader(cc, 256)
	var fb [64]byte
	ask := func(typ header.Type, id uint32, body []byte, want header.Type) []byte {
		t.Helper()
		cc.Write(header.AppendFrame(nil, typ, id, body))
		cc.SetReadDeadline(time.Now().Add(10 * time.Second))
		h, b, err := rr.ReadFrame(fb[:])
		if err != nil || h.Type != want || h.Stream != id {
			t.Fatalf("answer to %v %d: %v %d, %v", typ, id, h.Type, h.Stream, err)
		}
		return append([]byte(nil), b...)
	}
	q := header.AppendPeerQuery(nil, &header.PeerQuery{Seen: addrPort(r.RemoteAddr()), Local: addrPort(r.LocalAddr())})
	b := ask(header.TypePeerQuery, 7, q, header.TypePeerReply)
	if rep, err := header.ParsePeerReply(b); err != nil || !rep.Found || rep.SiteID != 3 {
		t.Errorf("PEER_REPLY %+v, %v; want the second gateway's (site id 3)", rep, err)
	}
	a := <-seen
	pq, err := header.ParsePeerQuery(a.body)
	if a.gw != 1 || err != nil || pq.Seen != gwEnd || pq.Local != dst || pq.Seen.Addr() != gwLAN2.Addr() {
		t.Errorf("gateway %d asked %+v, %v; want gateway 1 asked seen %v (on %v) local %v", a.gw, pq, err, gwEnd, gwLAN2.Addr(), dst)
	}
	b = ask(header.TypeListen, 8, header.AppendListen(nil, dst.Port()), header.TypeListenReply) // the rank's listener
	if b[0] != header.ListenOK {
		t.Errorf("LISTEN answered %d, want OK", b[0])
	}
	var listened [2]bool
	for range 2 {
		select {
		case a := <-seen:
			if a.h.Type != header.TypeListen {
				t.Errorf("gateway %d asked %v, want LISTEN", a.gw, a.h.Type)
			}
			listened[a.gw] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("LISTEN reached gateways %v, want both", listened)
		}
	}

	// An endpoint of the LAN that is no gateway of the site.
	ep := endpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 9, 9}), mx.Config{})
	foreign := &gateway.MXTransport{EP: ep, Resolve: func(netip.Addr) (mx.Addr, error) { return d.cfg.EP.Addr(), nil }}
	fs, err := foreign.Dial(ctx, netip.MustParseAddr("10.9.0.9"), dst, header.ResumeID{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { _, err := fs.Read(make([]byte, 1)); res <- err }()
	select {
	case err := <-res:
		if !errors.Is(err, mx.ErrReset) {
			t.Errorf("stream from a foreign endpoint: %v, want a reset", err)
		}
	case <-time.After(5 * time.Second):
		fs.Abort()
		t.Errorf("stream from a foreign endpoint not refused after 5 s")
	}
}

// TestDeadGatewaySkipped: with one of the site's two gateways not
// answering, every rank connection goes through the other; the first
// that tries the dead one loses at most its share of the dial timeout,
// and the connections after it try the live one first. A LISTEN is
// answered by the live gateway within the dial timeout.
func TestDeadGatewaySkipped(t *testing.T) {
	const dialTimeout = 2 * time.Second
	d, trs, _ := twoGateways(t, true, dialTimeout)
	got := make(chan int, 16)
	echoGateway(t, trs[0], gwLAN, 0, got)
	slow := 0
	for i := range 6 {
		start := time.Now()
		rankOpen(t, d)
		took := time.Since(start)
		<-got
		if took > dialTimeout/4 {
			slow++
			if took > dialTimeout {
				t.Errorf("connection %d took %v, more than the dial timeout %v", i, took, dialTimeout)
			}
		}
	}
	if slow > 1 {
		t.Errorf("%d of 6 connections waited for the dead gateway, want at most the first", slow)
	}
	rl, err := net.Listen("tcp", "127.0.0.1:0") // the rank's listener
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	cc, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	start := time.Now()
	cc.Write(header.AppendFrame(nil, header.TypeListen, 3, header.AppendListen(nil, addrPort(rl.Addr()).Port())))
	cc.SetReadDeadline(time.Now().Add(2 * dialTimeout))
	h, b, err := header.ReadOne(cc, header.MaxControl)
	if err != nil || h.Type != header.TypeListenReply || h.Stream != 3 || b[0] != header.ListenOK {
		t.Fatalf("LISTEN with a dead gateway: %v %d %x, %v; want OK", h.Type, h.Stream, b, err)
	}
	if took := time.Since(start); took > ctlReplyWait+dialTimeout/4 {
		t.Errorf("LISTEN with a dead gateway answered in %v, want within %v of the live one", took, ctlReplyWait)
	}
}
