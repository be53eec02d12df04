package gateway

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

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
		ep, err := e.Open(MXEndpoint)
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
