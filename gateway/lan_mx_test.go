package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
)

// mxSite puts site a's LAN on an in-memory Ethernet (loss as given): the
// gateway's MX endpoint and one node's, which plays the node daemon.
func mxSite(t testing.TB, loss float64) (*MXTransport, *mx.Endpoint) {
	hub := mx.NewMemHub(1500)
	if loss > 0 {
		hub.Fault = mx.RandomFault(7, loss, 0, 0.01)
	}
	gw, node := mxEndpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 1, 1})), mxEndpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 1, 2}))
	return &MXTransport{EP: gw}, node
}

// mxEndpoint starts an MX engine on link and opens the gateways' endpoint
// number on it; the engine closes when the test ends. It has the
// production peer timeout: the engine's 1 s default fails channels of a
// process starved under -race.
func mxEndpoint(t testing.TB, link mx.Link) *mx.Endpoint {
	t.Helper()
	e, err := mx.New(link, mx.Config{PeerTimeout: mxlan.PeerTimeout})
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

// mxOpen does what a node daemon does for a rank: a stream to the gateway
// naming the rank's endpoint, then OPEN, then the application's bytes.
func mxOpen(ctx context.Context, node *mx.Endpoint, gw mx.Addr, lan, src, dst netip.AddrPort) (*mx.Stream, error) {
	return mxOpenWith(ctx, node, gw, lan, src, dst, mx.StreamConfig{})
}

// mxOpenWith is mxOpen with the stream sized by cfg.
func mxOpenWith(ctx context.Context, node *mx.Endpoint, gw mx.Addr, lan, src, dst netip.AddrPort, cfg mx.StreamConfig) (*mx.Stream, error) {
	meta, err := header.AppendEndpointPair(nil, src, lan)
	if err != nil {
		return nil, err
	}
	s, err := mx.Dial(ctx, node, gw, meta, cfg)
	if err != nil {
		return nil, err
	}
	body, err := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Label: "mx test"})
	if err != nil {
		return nil, err
	}
	_, err = s.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
	return s, err
}

// TestMXLAN: checksummed streams from a node on site a's MX LAN, through
// gateway a (MX on the LAN, in each forwarding mode), the WAN, and gateway
// b (kernel TCP) to a server that echoes them; on a clean LAN, with 1 % of
// the LAN's frames lost, and with WAN connections reset every 20-60 ms
// (every link resumes). The node checks the bytes that come back, so both
// directions are checked, and its end of file comes back too.
func TestMXLAN(t *testing.T) {
	for _, mode := range lanForwardModes {
		for _, c := range []struct {
			name   string
			loss   float64
			resume bool
		}{{"loss0", 0, false}, {"loss0.01", 0.01, false}, {"wan-resume", 0, true}} {
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				tr, node := mxSite(t, c.loss)
				_, a, b := startPair(t, func(cfg *Config) {
					if cfg.Site == "a" {
						cfg.Transport, cfg.LANForward = tr, mode
					}
				})
				dst := testnet.Echo(t, nodeB)
				if c.resume {
					stop := breakLinks(a, b, 21)
					defer func() {
						kills := stop()
						if kills == 0 {
							t.Errorf("%d WAN connections reset: the test did not break the links", kills)
						}
						t.Logf("%d WAN connections reset", kills)
					}()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				const n = 40
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 5))
						src := netip.AddrPortFrom(nodeA, uint16(40000+i))
						s, err := mxOpen(ctx, node, tr.EP.Addr(), a.LANAddr(), src, dst)
						if err != nil {
							errs <- err
							return
						}
						defer s.Close()
						size := testnet.StreamSize(r, 2<<20)
						if c.resume && !raceEnabled { // enough bytes in flight for the resets to hit
							size = r.IntN(2<<20 + 1)
						}
						if err := echoAndCheck(s, r, size); err != nil {
							errs <- fmt.Errorf("stream %d: %w", i, err)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				if !t.Failed() {
					waitLANConns(t, a, 0, "every stream has ended")
				}
			})
		}
	}
}

// echoAndCheck writes size bytes drawn from r on s and half-closes, while
// it reads what an echo server sends back, to its end of file, and checks
// that the two are the same bytes.
func echoAndCheck(s *mx.Stream, r *rand.Rand, size int) error {
	sent := make(chan []byte, 1)
	werr := make(chan error, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for left := size; left > 0; {
			k := min(left, len(buf))
			testnet.Fill(r, buf[:k])
			h.Write(buf[:k])
			if _, err := s.Write(buf[:k]); err != nil {
				werr <- err
				return
			}
			left -= k
		}
		sent <- h.Sum(nil)
		werr <- s.CloseWrite()
	}()
	h := sha256.New()
	n, err := io.Copy(h, s)
	if err != nil {
		return fmt.Errorf("reading the echo after %d of %d bytes: %w", n, size, err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("writing %d bytes: %w", size, err)
	}
	if n != int64(size) || !bytes.Equal(h.Sum(nil), <-sent) {
		return fmt.Errorf("echo of %d bytes: %d bytes back, checksum mismatch", size, n)
	}
	return nil
}

// TestMXLANEndAndReset: in each forwarding mode, an end of file and a
// reset cross gateway a's MX LAN both ways, and the streams end at the
// gateway. (A reset while writes toward the node never finish: relay's
// TestPipelinedConn.)
func TestMXLANEndAndReset(t *testing.T) {
	for _, mode := range lanForwardModes {
		t.Run(mode, func(t *testing.T) {
			tr, node := mxSite(t, 0)
			_, a, _ := startPair(t, func(c *Config) {
				if c.Site == "a" {
					c.Transport, c.LANForward = tr, mode
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			port := uint16(41000)
			open := func(dst netip.AddrPort) *mx.Stream {
				t.Helper()
				port++
				s, err := mxOpen(ctx, node, tr.EP.Addr(), a.LANAddr(), netip.AddrPortFrom(nodeA, port), dst)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}

			// End of file toward the node once the server is done, with
			// every byte before it; the node's end reaches the server.
			big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
			gotEOF := make(chan error, 1)
			srv := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
				c.Write(big)
				c.CloseWrite()
				_, err := io.Copy(io.Discard, c)
				gotEOF <- err
			})
			s := open(srv)
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, big) {
				t.Fatalf("stream toward the node: %d of %d bytes, %v", len(got), len(big), err)
			}
			s.CloseWrite()
			select {
			case err := <-gotEOF:
				if err != nil {
					t.Fatalf("server: %v, want the node's end of file", err)
				}
			case <-ctx.Done():
				t.Fatal("the node's end of file did not reach the server")
			}

			// The node resets: the server sees ECONNRESET.
			rstErr := make(chan error, 1)
			sink := testnet.Serve(t, nodeB, func(c *net.TCPConn) { _, err := io.Copy(io.Discard, c); rstErr <- err })
			s = open(sink)
			s.Write([]byte("abc"))
			time.Sleep(50 * time.Millisecond)
			s.Abort()
			select {
			case err := <-rstErr:
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("server after the node's reset: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("the node's reset did not reach the server")
			}

			// The server resets: the node sees the reset, and gateway a
			// ends the stream.
			waitLANConns(t, a, 0, "the earlier streams have ended")
			reset := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
				c.Write(big[:100<<10])
				time.Sleep(50 * time.Millisecond)
				c.SetLinger(0)
				c.Close()
			})
			s = open(reset)
			if _, err := io.ReadAll(s); !errors.Is(err, mx.ErrReset) {
				t.Fatalf("node after the server's reset: %v, want %v", err, mx.ErrReset)
			}
			waitLANConns(t, a, 0, "the reset stream has ended")
		})
	}
}

// waitLANConns waits up to 10 s until gateway a counts want LAN
// connections, or fails the test saying what should have happened.
func waitLANConns(t *testing.T, a *testGW, want int64, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.lanConns.Load() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if k := a.lanConns.Load(); k != want {
		t.Fatalf("%s, yet gateway a counts %d LAN connections, want %d", what, k, want)
	}
}

// TestMXLANWrongGateway: a stream whose open names another address than
// the gateway's is reset, not served.
func TestMXLANWrongGateway(t *testing.T) {
	tr, node := mxSite(t, 0)
	lan := netip.MustParseAddrPort("127.1.0.1:4000")
	ln, err := tr.Listen(lan)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := tr.Listen(lan); err == nil {
		t.Fatal("a second listener on one endpoint")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := netip.AddrPortFrom(nodeA, 40000)
	type accepted struct {
		c   LANConn
		err error
	}
	acc := make(chan accepted, 1)
	go func() { c, err := ln.Accept(); acc <- accepted{c, err} }()
	// The reset may come before the OPEN is written (its write fails) or
	// after (the read does).
	bad, err := mxOpen(ctx, node, tr.EP.Addr(), netip.MustParseAddrPort("127.1.0.9:4000"), src, src)
	if err == nil {
		_, err = io.ReadAll(bad)
	}
	if !errors.Is(err, mx.ErrReset) {
		t.Fatalf("stream naming another gateway: %v, want %v", err, mx.ErrReset)
	}
	good, err := mxOpen(ctx, node, tr.EP.Addr(), lan, src, src)
	if err != nil {
		t.Fatal(err)
	}
	got := <-acc
	c, err := got.c, got.err
	if err != nil {
		t.Fatal(err)
	}
	if c.Remote() != src || c.Local() != lan {
		t.Fatalf("accepted %v -> %v, want %v -> %v", c.Remote(), c.Local(), src, lan)
	}
	good.Close()
}

// TestMXTwoGateways: site a has two gateway hosts, each with an MX engine
// of its own on the site's Ethernet. A node's streams to either gateway
// cross the WAN and come back whole, and streams from site b to the
// node arrive through both of a's gateways, each naming its own LAN
// address as the stream's source.
func TestMXTwoGateways(t *testing.T) {
	m := multiMap(t, 2)
	hub := mx.NewMemHub(1500)
	open := func(mac mx.MAC) *mx.Endpoint { return mxEndpoint(t, hub.Attach(mac)) }
	node := open(mx.MAC{2, 0, 0, 0, 1, 2})
	a, _ := m.Site("a")
	b, _ := m.Site("b")
	var as []*testGW
	var trs []*MXTransport
	for i, gw := range a.Gateways {
		tr := &MXTransport{EP: open(mx.MAC{2, 0, 0, 0, 1, byte(10 + i)}),
			Resolve: func(netip.Addr) (mx.Addr, error) { return node.Addr(), nil }}
		trs = append(trs, tr)
		as = append(as, startGW(t, m, "a", func(c *Config) {
			c.ListenLAN, c.ListenWAN, c.Transport, c.AllowPorts = gw.LAN, gw.WAN, tr, PortSet{{1, 65535}}
		}))
	}
	var bs []*testGW
	for _, gw := range b.Gateways {
		bs = append(bs, startGW(t, m, "b", func(c *Config) { c.ListenLAN, c.ListenWAN = gw.LAN, gw.WAN }))
	}
	for _, g := range append(as, bs...) {
		select {
		case <-g.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("mesh did not come up")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Node to site b, through each of a's gateways.
	dst := testnet.Echo(t, nodeB)
	for i, tr := range trs {
		r := rand.New(rand.NewPCG(uint64(i), 9))
		s, err := mxOpen(ctx, node, tr.EP.Addr(), a.Gateways[i].LAN, netip.AddrPortFrom(nodeA, uint16(41000+i)), dst)
		if err != nil {
			t.Fatalf("stream to gateway %d: %v", i, err)
		}
		if err := echoAndCheck(s, r, 256<<10); err != nil {
			t.Errorf("stream through gateway %d of site a: %v", i, err)
		}
		s.Close()
	}

	// Site b to the node: the node's endpoint accepts, echoes, and
	// reports which gateway (MAC) opened each stream and the source it
	// named.
	type from struct {
		peer mx.Addr
		src  netip.Addr
	}
	seen := make(chan from, 64)
	ln, err := mx.Listen(node, mx.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			s, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			src, _, _ := header.ParseEndpointPair(s.Meta)
			seen <- from{s.Peer(), src.Addr()}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	const streams = 12
	toNode := netip.AddrPortFrom(nodeA, 7000)
	for i := range streams {
		c, err := lanOpen(b.Gateways[i%2].LAN, nodeB, toNode)
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte(fmt.Sprintf("stream %d", i))
		c.Write(msg)
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		back, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(back, msg) {
			t.Fatalf("stream %d from site b: %q, %v", i, back, err)
		}
	}
	by := map[mx.Addr]int{}
	for range streams {
		f := <-seen
		by[f.peer]++
		for i, tr := range trs {
			if f.peer == tr.EP.Addr() && f.src != a.Gateways[i].LAN.Addr() {
				t.Errorf("stream from gateway %d names source %v, want its LAN address %v", i, f.src, a.Gateways[i].LAN.Addr())
			}
		}
	}
	for i, tr := range trs {
		if by[tr.EP.Addr()] == 0 {
			t.Errorf("gateway %d of site a opened none of %d streams to the node (%v)", i, streams, by)
		}
	}
}

// TestMXResumeVerdict: a gateway answers a node daemon's OPEN with a
// resume id by OPEN_REPLY: 1 when the far gateway delivers to node daemons
// (MX LAN, HELLO feature NODE_RESUME), which then get the id in the
// stream's open metadata; 0 when it reaches ranks over kernel TCP, and the
// stream goes on plain.
func TestMXResumeVerdict(t *testing.T) {
	id := header.ResumeID{1, 2, 3, 15: 4}
	open := func(ctx context.Context, node *mx.Endpoint, gw mx.Addr, lan, src, dst netip.AddrPort) (*mx.Stream, byte) {
		t.Helper()
		meta, _ := header.AppendEndpointPair(nil, src, lan)
		s, err := mx.Dial(ctx, node, gw, meta, mx.StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Resume: id})
		if _, err := s.Write(header.AppendFrame(nil, header.TypeOpen, 0, body)); err != nil {
			t.Fatal(err)
		}
		h, b, err := header.ReadOne(s, 16)
		if err != nil || h.Type != header.TypeOpenReply {
			t.Fatalf("answer to a resumable OPEN: %v %x, %v", h.Type, b, err)
		}
		return s, b[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("tcp-far", func(t *testing.T) {
		tr, node := mxSite(t, 0)
		_, a, _ := startPair(t, func(cfg *Config) {
			if cfg.Site == "a" {
				cfg.Transport = tr
			}
		})
		s, v := open(ctx, node, tr.EP.Addr(), a.LANAddr(), netip.AddrPortFrom(nodeA, 40001), testnet.Echo(t, nodeB))
		defer s.Close()
		if v != 0 {
			t.Fatalf("OPEN_REPLY %d toward a kernel TCP site, want 0", v)
		}
		if err := echoAndCheck(s, rand.New(rand.NewPCG(1, 1)), 100<<10); err != nil {
			t.Fatalf("plain stream after OPEN_REPLY 0: %v", err)
		}
	})
	t.Run("mx-far", func(t *testing.T) {
		tra, nodeA1 := mxSite(t, 0)
		hub := mx.NewMemHub(1500)
		gwB, nodeB1 := mxEndpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 2, 1})), mxEndpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 2, 2}))
		trb := &MXTransport{EP: gwB, Resolve: func(netip.Addr) (mx.Addr, error) { return nodeB1.Addr(), nil }}
		_, a, _ := startPair(t, func(cfg *Config) {
			if cfg.Site == "a" {
				cfg.Transport = tra
			} else {
				cfg.Transport = trb
			}
		})
		ln, err := mx.Listen(nodeB1, mx.StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		dst := netip.AddrPortFrom(nodeB, 7000)
		s, v := open(ctx, nodeA1, tra.EP.Addr(), a.LANAddr(), netip.AddrPortFrom(nodeA, 40002), dst)
		defer s.Close()
		if v != 1 {
			t.Fatalf("OPEN_REPLY %d toward an MX site, want 1", v)
		}
		fs, err := ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer fs.Close()
		_, to, got, err := header.ParseStreamMeta(fs.Meta)
		if err != nil || to != dst || got != id {
			t.Fatalf("far node's stream metadata: to %v id %x, %v; want %v %x", to, got, err, dst, id)
		}
	})
}

// TestMXIdleStreamsNoGoroutine: streams from an MX LAN that carry nothing
// after their OPEN leave no goroutine waiting in the relay for the node's
// bytes (the MX stream's callback runs the relay's step, as the poller
// thread does for a socket); each still carries an echo afterwards.
func TestMXIdleStreamsNoGoroutine(t *testing.T) {
	tr, node := mxSite(t, 0)
	_, a, _ := startPair(t, func(cfg *Config) {
		if cfg.Site == "a" {
			cfg.Transport = tr
		}
	})
	dst := testnet.Echo(t, nodeB)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 50
	ss := make([]*mx.Stream, n)
	for i := range ss {
		src := netip.AddrPortFrom(nodeA, uint16(41000+i))
		s, err := mxOpen(ctx, node, tr.EP.Addr(), a.LANAddr(), src, dst)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ss[i] = s
	}
	waitLANConns(t, a, n, "every stream is open")
	waiting := func() (k int) {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 2)
		for _, g := range strings.Split(buf.String(), "\n\n") {
			if strings.Contains(g, "relay.(*Stream).outStep") && strings.Contains(g, "mx.(*Stream).Read") {
				k++
			}
		}
		return k
	}
	k := waiting()
	for deadline := time.Now().Add(5 * time.Second); k > 0 && time.Now().Before(deadline); k = waiting() {
		time.Sleep(20 * time.Millisecond)
	}
	if k > 0 {
		t.Errorf("%d goroutines wait in the relay's read of %d idle MX streams, want none", k, n)
	}
	for i, s := range ss {
		if err := echoAndCheck(s, rand.New(rand.NewPCG(uint64(i), 9)), 1000); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
}

// TestMXControlOutlivesFirstFrame: an MX control connection that has
// registered a port lives on past the first frame's deadline, which
// bounds only the wait for that frame: the registration, and the stream
// that holds it, last as long as the rank's process (a node daemon's
// resumed stream into the port is refused once it is gone).
func TestMXControlOutlivesFirstFrame(t *testing.T) {
	tr, node := mxSite(t, 0)
	_, a, _ := startPair(t, func(cfg *Config) {
		if cfg.Site == "a" {
			cfg.Transport, cfg.FirstFrame = tr, 200*time.Millisecond
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rank := netip.AddrPortFrom(nodeA, 40001)
	meta, err := header.AppendEndpointPair(nil, rank, a.LANAddr())
	if err != nil {
		t.Fatal(err)
	}
	s, err := mx.Dial(ctx, node, tr.EP.Addr(), meta, mx.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const port = 40002
	for i := range 2 {
		if _, err := s.Write(header.AppendFrame(nil, header.TypeListen, uint32(i+1), header.AppendListen(nil, port))); err != nil {
			t.Fatal(err)
		}
		h, body, err := header.ReadOne(s, header.MaxControl)
		if err != nil {
			t.Fatalf("LISTEN %d: %v", i+1, err)
		}
		if h.Type != header.TypeListenReply || len(body) == 0 || body[0] != header.ListenOK {
			t.Fatalf("LISTEN %d answered %v %x", i+1, h.Type, body)
		}
		if i == 0 {
			time.Sleep(5 * a.cfg.FirstFrame)
		}
	}
	if !a.listens.has(netip.AddrPortFrom(nodeA, port)) {
		t.Errorf("port %d is no longer registered after %v", port, 5*a.cfg.FirstFrame)
	}
}
