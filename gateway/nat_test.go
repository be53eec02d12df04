package gateway

import (
	mrand "math/rand/v2"
	"net/netip"
	"testing"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
)

// natMaps are the maps of a pair whose site b (the higher id) is behind
// NAT: b's own lists its real WAN listener; a's lists for b an address
// where nothing listens, as a NAT's outside address that forwards nothing.
func natMaps(t *testing.T, ks siteKeys) (ma, mb *sitemap.Map) {
	lanA, wanA, lanB, wanB := ports(t)
	build := func(bWAN netip.AddrPort) *sitemap.Map {
		m, err := sitemap.NewBuilder().
			AddSite("a", 1, lanA, wanA).AddSite("b", 2, lanB, bWAN).BehindNAT().
			AddNet("a", netip.MustParsePrefix("127.1.0.0/16")).
			AddNet("b", netip.MustParsePrefix("127.2.0.0/16")).
			AddKey("a", ks.pub("a")).AddKey("b", ks.pub("b")).Build()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return build(netip.AddrPortFrom(gwB, freePort(t, gwB))), build(wanB)
}

// TestNATHigherSite: site b, whose id is higher, is behind NAT (nat=yes)
// and cannot be reached: it dials a, a accepts it by key and never dials
// it, and streams cross both ways.
func TestNATHigherSite(t *testing.T) {
	ks := newKeys(t, "a", "b")
	ma, mb := natMaps(t, ks)
	a := startGW(t, ma, "a", withKey(ks))
	b := startGW(t, mb, "b", withKey(ks))
	waitReady(t, a, b)
	if pa, pb := a.peer(peerID{2, 0}), b.peer(peerID{1, 0}); pa.dialer || !pb.dialer {
		t.Fatalf("a dials b: %v, b dials a: %v; want only b (behind NAT) to dial", pa.dialer, pb.dialer)
	}
	for _, dir := range []struct {
		from *testGW
		src  netip.Addr
		dst  netip.Addr
	}{{a, nodeA, nodeB}, {b, nodeB, nodeA}} {
		dst := testnet.Serve(t, dir.dst, testnet.SumServer)
		c, err := lanOpen(dir.from.LANAddr(), dir.src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := testnet.SendAndCheck(c, mrand.New(mrand.NewPCG(5, 5)), 1<<20); err != nil {
			t.Fatalf("stream %v -> %v: %v", dir.src, dst, err)
		}
		c.Close()
	}
}
