package gateway

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// TestMXReloadAdmits: a reload (Gateway.Reload) changes which MACs the
// gateway's MX engine admits at once: a node the new map puts in the site
// connects, one it takes out is dropped as foreign.
func TestMXReloadAdmits(t *testing.T) {
	inA := netip.MustParseAddr("127.1.0.50")   // site a's net in testMap
	later := netip.MustParseAddr("127.3.0.50") // in no site until the reload
	macIn, macLater := mx.MAC{2, 0, 0, 0, 3, 2}, mx.MAC{2, 0, 0, 0, 3, 3}
	nb := &neighbors{site: 1, list: func() ([]netlink.Neigh, error) {
		return []netlink.Neigh{
			{IP: inA.AsSlice(), HardwareAddr: net.HardwareAddr(macIn[:]), State: netlink.NUD_REACHABLE},
			{IP: later.AsSlice(), HardwareAddr: net.HardwareAddr(macLater[:]), State: netlink.NUD_STALE},
		}, nil
	}}
	hub := mx.NewMemHub(1500)
	var eps []*mx.Endpoint
	var gwEngine *mx.Engine
	for i, mac := range []mx.MAC{{2, 0, 0, 0, 3, 1}, macIn, macLater} {
		cfg := mx.Config{PeerTimeout: 300 * time.Millisecond}
		if i == 0 {
			cfg.Allow = nb.allowed
		}
		e, err := mx.New(hub.Attach(mac), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		if i == 0 {
			gwEngine = e
		}
		ep, err := e.Open(mxlan.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	tr := &MXTransport{EP: eps[0], mapChanged: nb.setMap}
	m1, a, _ := startPair(t, func(c *Config) {
		if c.Site == "a" {
			c.Transport = tr
		}
	})
	nb.smap.Store(m1)
	connects := func(ep *mx.Endpoint) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return ep.Connect(ctx, eps[0].Addr()) == nil
	}
	if !connects(eps[1]) {
		t.Fatal("a node of site a is not admitted")
	}
	if connects(eps[2]) {
		t.Fatal("a node outside every site is admitted")
	}

	// The reload moves site a from 127.1/16 to 127.3/16.
	b := sitemap.NewBuilder()
	for _, s := range m1.Sites() {
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
	}
	b.AddNet("a", netip.MustParsePrefix("127.3.0.0/16"))
	b.AddNet("b", netip.MustParsePrefix("127.2.0.0/16"))
	m2, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	// What the gateway learned from a node of the old net goes with it.
	tr.learned.Store(inA, eps[1].Addr())
	tr.nLearned.Add(1)
	if _, err := a.Reload(m2); err != nil {
		t.Fatal(err)
	}
	if _, ok := tr.learned.Load(inA); ok || tr.nLearned.Load() != 0 {
		t.Errorf("the reload left %v learned (%d in all), a node it took out of site a", inA, tr.nLearned.Load())
	}
	if !connects(eps[2]) {
		t.Error("a node the reload put in site a is not admitted")
	}
	before := gwEngine.Stats().Foreign
	if connects(eps[1]) { // its channel is open: Connect returns at once
		if _, err := eps[1].Isend(eps[0].Addr(), 1, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for gwEngine.Stats().Foreign == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if gwEngine.Stats().Foreign == before {
		t.Error("frames from a node the reload took out of site a are still admitted")
	}
}

// TestMXIdentity: a stream's open metadata may claim only a node address
// the gateway's neighbour table gives to the MAC the stream comes from.
// A node whose root sends any MX frame it likes claims another host's
// address: it is refused, so it can neither register that host's ports
// (LISTEN) nor become where the gateway's streams for that host go; an
// address no host answers for is refused too, after the gateway tried to
// resolve it; the node's own addresses work, one the table learns only
// after the gateway asked too.
func TestMXIdentity(t *testing.T) {
	own := netip.MustParseAddr("127.1.0.10")    // the attacker's node, in site a
	victim := netip.MustParseAddr("127.1.0.11") // another host of site a
	nobody := netip.MustParseAddr("127.1.0.12") // no host holds it
	late := netip.MustParseAddr("127.1.0.13")   // the node's second address, not in the table yet
	macGW, macOwn, macVictim := mx.MAC{2, 0, 0, 0, 4, 1}, mx.MAC{2, 0, 0, 0, 4, 2}, mx.MAC{2, 0, 0, 0, 4, 3}
	var reads, lateAfter atomic.Int64
	lateAfter.Store(1 << 62)
	nb := &neighbors{site: 1, list: func() ([]netlink.Neigh, error) {
		l := []netlink.Neigh{
			{IP: own.AsSlice(), HardwareAddr: net.HardwareAddr(macOwn[:]), State: netlink.NUD_REACHABLE},
			{IP: victim.AsSlice(), HardwareAddr: net.HardwareAddr(macVictim[:]), State: netlink.NUD_STALE},
		}
		if reads.Add(1) > lateAfter.Load() {
			l = append(l, netlink.Neigh{IP: late.AsSlice(), HardwareAddr: net.HardwareAddr(macOwn[:]), State: netlink.NUD_REACHABLE})
		}
		return l, nil
	}}
	hub := mx.NewMemHub(1500)
	gwEngine, err := mx.New(hub.Attach(macGW), mx.Config{Allow: nb.allowed, PeerTimeout: mxlan.PeerTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gwEngine.Close() })
	gw, err := gwEngine.Open(mxlan.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	node := mxEndpoint(t, hub.Attach(macOwn))
	tr := &MXTransport{EP: gw, Resolve: nb.resolve, Bind: nb.bind, mapChanged: nb.setMap}
	m, a, _ := startPair(t, func(c *Config) {
		if c.Site == "a" {
			c.Transport = tr
		}
	})
	nb.smap.Store(m)

	// listen registers port as the node address src over MX and returns
	// the gateway's answer, or the error that ended the stream.
	listen := func(src netip.AddrPort) (uint8, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		meta, err := header.AppendEndpointPair(nil, src, a.LANAddr())
		if err != nil {
			t.Fatal(err)
		}
		s, err := mx.Dial(ctx, node, gw.Addr(), meta, mx.StreamConfig{})
		if err != nil {
			return 0, err
		}
		defer s.Close()
		if _, err := s.Write(header.AppendFrame(nil, header.TypeListen, 1, header.AppendListen(nil, src.Port()))); err != nil {
			return 0, err
		}
		stop := context.AfterFunc(ctx, func() { s.Abort() })
		defer stop()
		h, body, err := header.ReadOne(s, 64)
		if err != nil {
			return 0, err
		}
		if h.Type != header.TypeListenReply || len(body) != 1 {
			t.Fatalf("LISTEN answered with %v % x", h.Type, body)
		}
		return body[0], nil
	}

	for _, c := range []struct {
		name string
		addr netip.Addr
	}{{"another host's address", victim}, {"an address no host holds", nobody}} {
		code, err := listen(netip.AddrPortFrom(c.addr, 40000))
		if err == nil {
			t.Errorf("a stream claiming %s (%v) registered a port: answer %d", c.name, c.addr, code)
		}
		if _, ok := tr.learned.Load(c.addr); ok {
			t.Errorf("the gateway took the node for %s (%v): its streams to it would go to the node", c.name, c.addr)
		}
	}
	if n := a.listens.n.Load(); n != 0 {
		t.Errorf("%d ports registered by streams that claimed other addresses", n)
	}
	if n := refusedFor(t, a, "mx_identity"); n != 2 {
		t.Errorf("mx_identity refusals %v, want 2", n)
	}
	if code, err := listen(netip.AddrPortFrom(own, 40000)); err != nil || code != header.ListenOK {
		t.Fatalf("the node's own address: answer %d, %v", code, err)
	}
	if v, ok := tr.learned.Load(own); !ok || v.(mx.Addr) != node.Addr() {
		t.Errorf("the gateway did not learn where the node is: %v", v)
	}
	// The claim waits for the table off the accept loop, and the stream
	// is served though no other follows it.
	lateAfter.Store(reads.Load() + 3)
	if code, err := listen(netip.AddrPortFrom(late, 40001)); err != nil || code != header.ListenOK {
		t.Fatalf("the node's address the table learned late: answer %d, %v", code, err)
	}
}

// TestMXBindResolves: a claim of an address the neighbour table does not
// hold yet waits for the kernel to resolve it, and holds once the table
// gives the address to the stream's MAC; one the table has forgotten
// holds at once if an earlier stream from that MAC bound it.
func TestMXBindResolves(t *testing.T) {
	a := netip.MustParseAddr("127.1.0.20")
	mac := mx.MAC{2, 0, 0, 0, 5, 2}
	var reads atomic.Int32
	nb := &neighbors{site: 1, list: func() ([]netlink.Neigh, error) {
		if reads.Add(1) < 3 { // resolved only after a few reads
			return nil, nil
		}
		return []netlink.Neigh{{IP: a.AsSlice(), HardwareAddr: net.HardwareAddr(mac[:]), State: netlink.NUD_REACHABLE}}, nil
	}}
	nb.smap.Store(testMap(t))
	if err := nb.bind(a, mac, false); !errors.Is(err, errUnresolved) {
		t.Fatalf("bind without wait of an address not in the table: %v, want %v", err, errUnresolved)
	}
	if err := nb.bind(a, mac, true); err != nil {
		t.Fatalf("bind with wait: %v", err)
	}
	if err := nb.bind(a, mx.MAC{2, 0, 0, 0, 5, 3}, true); err == nil {
		t.Fatal("another MAC bound the address")
	}

	forgot := &neighbors{site: 1, list: func() ([]netlink.Neigh, error) { return nil, nil }}
	forgot.smap.Store(testMap(t))
	tr := &MXTransport{Bind: forgot.bind}
	from := mx.Addr{MAC: mac, EP: mxlan.Endpoint}
	tr.learned.Store(a, from)
	if err := tr.Bind(a, mac, false); !tr.learnedAs(a, from, err) {
		t.Errorf("an address bound earlier to the same endpoint is not taken: %v", err)
	}
	if err := tr.Bind(a, mx.MAC{2, 0, 0, 0, 5, 3}, false); tr.learnedAs(a, mx.Addr{MAC: mx.MAC{2, 0, 0, 0, 5, 3}, EP: mxlan.Endpoint}, err) {
		t.Error("an address bound earlier to another endpoint is taken")
	}
}
