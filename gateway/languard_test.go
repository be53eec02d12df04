package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// heapInuse is the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// bigFirstFrame is the header of a first frame a node has no reason to
// send: PAD (i even) or DATA declaring the largest payload, with a few
// bytes of it.
func bigFirstFrame(i int) []byte {
	var b [header.Size + 16]byte
	h := header.Header{Type: header.TypePad, Length: header.MaxPayload}
	if i%2 == 1 {
		h = header.Header{Type: header.TypeData, Stream: 1, Length: header.MaxPayload}
	}
	h.Encode(b[:])
	return b[:]
}

// TestBigFirstFrame: 512 LAN connections from nodes of the site, each
// declaring a 1 MiB PAD or DATA as its first frame and sending a little
// of it, cost the gateway no more than their headers: it refuses each
// from its header (lan_first_frame) and its heap stays where it was. (A
// gateway that allocated the declared length held 512 MiB until
// FirstFrame.)
func TestBigFirstFrame(t *testing.T) {
	const n = 512
	g := startGW(t, testMap(t), "a", nil)
	before := heapInuse()
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		// 8 hosts: below each one's MaxSourcePending.
		src := netip.AddrFrom4([4]byte{127, 1, 3, byte(1 + i%8)})
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: src.AsSlice()}, net.TCPAddrFromAddrPort(g.LANAddr()))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		c.Write(bigFirstFrame(i)) // may fail once refused
	}
	deadline := time.Now().Add(5 * time.Second)
	for refusedFor(t, g, "lan_first_frame") < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	grew := int64(heapInuse()) - int64(before)
	t.Logf("heap in use %.1f MiB before, grew %.1f MiB with %d connections declaring 1 MiB first frames",
		float64(before)/(1<<20), float64(grew)/(1<<20), n)
	if grew > 32<<20 {
		t.Errorf("heap grew %.1f MiB for %d first-frame headers, want under 32 MiB", float64(grew)/(1<<20), n)
	}
	if r := refusedFor(t, g, "lan_first_frame"); r != n {
		t.Errorf("lan_first_frame refusals %v, want %d", r, n)
	}
	for i, c := range conns[:8] {
		expectReset(t, c, fmt.Sprintf("connection %d", i))
	}
	if p := g.lanPending.Load(); p != 0 {
		t.Errorf("%d LAN connections still pending", p)
	}
}

// dialMany opens n connections from src to gw, each sending first (nil:
// nothing), and returns those the gateway did not reset at once; the
// test closes them when it ends.
func dialMany(t *testing.T, gw netip.AddrPort, src netip.Addr, n int, first func(i int) []byte) []*net.TCPConn {
	t.Helper()
	conns := make([]*net.TCPConn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: src.AsSlice()}, net.TCPAddrFromAddrPort(gw))
		if errors.Is(err, syscall.ECONNRESET) {
			continue // refused at accept before the connect returned
		}
		if err != nil {
			t.Fatalf("connection %d from %v: %v", i, src, err)
		}
		conns = append(conns, c)
		if first != nil {
			c.Write(first(i)) // fails once the gateway has reset it
		}
	}
	return conns
}

// peerQueryFrame is a PEER_QUERY about a connection nobody made.
func peerQueryFrame(id uint32, node netip.Addr) []byte {
	q := header.PeerQuery{Seen: netip.AddrPortFrom(gwA, 1), Local: netip.AddrPortFrom(node, 1)}
	return header.AppendFrame(nil, header.TypePeerQuery, id, header.AppendPeerQuery(nil, &q))
}

// TestSourceFloods: one host of the site opens thousands of control
// connections and then thousands that never send a first frame, more
// than MaxLANConns and MaxPendingLAN together: it keeps MaxSourceControl
// control connections and fills the rest with pending ones, yet a rank
// on another host still opens a stream and asks a PEER_QUERY, each
// taking the place of the flooding host's oldest pending connection.
func TestSourceFloods(t *testing.T) {
	const maxConns = 1200
	_, a, _ := startPair(t, func(c *Config) { c.MaxLANConns, c.MaxPendingLAN = maxConns, maxConns })
	if a.cfg.MaxSourceControl != maxConns/8 || a.cfg.MaxSourcePending != maxConns {
		t.Fatalf("MaxSourceControl %d, MaxSourcePending %d: want the defaults %d, %d", a.cfg.MaxSourceControl, a.cfg.MaxSourcePending, maxConns/8, maxConns)
	}
	dst := testnet.Serve(t, nodeB, echoServer)
	attacker := netip.MustParseAddr("127.1.0.66")

	dialMany(t, a.LANAddr(), attacker, 1500, func(i int) []byte { return peerQueryFrame(uint32(i+1), attacker) })
	settle(t, a)
	if n := a.lanControl.Load(); n != int64(a.cfg.MaxSourceControl) {
		t.Errorf("one host holds %d control connections, want its limit %d", n, a.cfg.MaxSourceControl)
	}
	dialMany(t, a.LANAddr(), attacker, 1500, nil)
	settle(t, a)
	t.Logf("one host holds %d LAN connections (%d control, %d pending) of %d", a.lanConns.Load(), a.lanControl.Load(), a.lanPending.Load(), maxConns)
	if n := a.lanConns.Load(); n != maxConns {
		t.Errorf("one host holds %d LAN connections, want all %d (the rest pending)", n, maxConns)
	}

	// The rank on another node: a stream, and its control connection.
	c, err := lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatalf("rank's stream under the flood: %v", err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatalf("rank's stream under the flood: %v", err)
	}
	q := listenConn(t, a.LANAddr(), nodeA)
	defer q.Close()
	q.Write(peerQueryFrame(9, nodeA))
	q.SetReadDeadline(time.Now().Add(10 * time.Second))
	if h, _, err := header.ReadOne(q, 64); err != nil || h.Type != header.TypePeerReply || h.Stream != 9 {
		t.Fatalf("rank's PEER_QUERY under the flood: %v %v", h, err)
	}
	if r := refusedFor(t, a, "source_control"); r < 1500-maxConns/8-1 {
		t.Errorf("source_control refusals %v, want at least %d", r, 1500-maxConns/8-1)
	}
	if r := refusedFor(t, a, "lan_pending_evicted"); r != 2 {
		t.Errorf("lan_pending_evicted %v, want 2 (the rank's two connections)", r)
	}
}

// TestSourcePendingCap: with MaxSourcePending set, a host's connections
// past it are reset at accept while another host's are not.
func TestSourcePendingCap(t *testing.T) {
	g := startGW(t, testMap(t), "a", func(c *Config) { c.MaxSourcePending = 2 })
	dialMany(t, g.LANAddr(), nodeA, 3, nil)
	dialMany(t, g.LANAddr(), netip.MustParseAddr("127.1.0.11"), 2, nil)
	settle(t, g)
	if p := g.lanPending.Load(); p != 4 {
		t.Errorf("%d connections pending, want 4 (2 per host)", p)
	}
	if r := refusedFor(t, g, "source_pending"); r != 1 {
		t.Errorf("source_pending refusals %v, want 1", r)
	}
}

// settle waits until g has accepted what the kernel queued: its LAN
// connection and refusal counts have not changed for half a second.
func settle(t *testing.T, g *testGW) {
	last, stable := -1.0, 0
	for range 200 {
		time.Sleep(50 * time.Millisecond)
		n := float64(g.lanConns.Load()+g.lanPending.Load()) + counter(t, g, "mpi5k_lan_refused_total")
		if n != last {
			last, stable = n, 0
		} else if stable++; stable == 10 {
			return
		}
	}
}

// TestControlIdle: a control connection that holds no LISTEN port and
// sends nothing for ControlIdle is closed (control_idle); one that keeps
// asking, or that holds a LISTEN port, is not.
func TestControlIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	g := startGW(t, testMap(t), "a", func(c *Config) { c.ControlIdle = idle })
	ask := func(c *net.TCPConn, id uint32) error {
		if _, err := c.Write(peerQueryFrame(id, nodeA)); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		h, _, err := header.ReadOne(c, 64)
		if err == nil && (h.Type != header.TypePeerReply || h.Stream != id) {
			err = fmt.Errorf("answered %v %d", h.Type, h.Stream)
		}
		return err
	}
	quiet := listenConn(t, g.LANAddr(), nodeA)
	defer quiet.Close()
	busy := listenConn(t, g.LANAddr(), nodeA)
	defer busy.Close()
	holder := listenConn(t, g.LANAddr(), nodeA)
	defer holder.Close()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(nodeA, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := ask(quiet, 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code := register(t, holder, 1, uint16(ln.Addr().(*net.TCPAddr).Port)); code != header.ListenOK {
		t.Fatalf("LISTEN answered %d", code)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for id := uint32(1); time.Since(start) < 4*idle; id++ {
			if err := ask(busy, id); err != nil {
				t.Errorf("a control connection asking every %v closed: %v", idle/3, err)
				return
			}
			time.Sleep(idle / 3)
		}
	}()
	quiet.SetReadDeadline(time.Now().Add(10 * idle))
	_, err = quiet.Read(make([]byte, 1))
	if took := time.Since(start); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) || took < idle*3/4 || took > 8*idle {
		t.Errorf("quiet control connection: %v after %v, want closed after %v", err, took, idle)
	}
	wg.Wait()
	if err := ask(holder, 2); err != nil {
		t.Errorf("a control connection holding a LISTEN port, quiet for %v: %v", time.Since(start), err)
	}
	if r := refusedFor(t, g, "control_idle"); r != 1 {
		t.Errorf("control_idle %v, want 1", r)
	}
}
