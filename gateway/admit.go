package gateway

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// WAN admission before authentication (docs/security.md, "Strangers on
// the WAN"). Until a connection has proved a key (or, keyless, until its
// source is checked), it holds a pending slot. Slots come from two kinds
// of pool:
//
//   - each address the map lists for another site's gateway (sites not
//     behind NAT) has a pool of its own, which only connections from that
//     address take: an off-path host cannot complete a TCP handshake from
//     an address it does not own, so no stranger can take these slots.
//     A connection from such an address that finds its pool full takes a
//     shared slot as any other would;
//   - every other source (a stranger, a NAT site's gateway) shares
//     MaxPendingWAN slots, at most MaxSourcePendingWAN per source address,
//     dropped at random as they fill (OpenSSH's MaxStartups start:rate:full
//     with start half of MaxPendingWAN, rate 30 %), and has a shorter time
//     to authenticate (strangerAuthTime).
//
// A refused connection is reset before a byte of it is read: what it
// costs the gateway is an accept and a close.

// Random early drop of the shared pool: past dropStart of MaxPendingWAN in
// use, a new connection is dropped with probability dropRate, rising
// linearly to 1 when the pool is full.
const (
	dropStartFrac = 2 // start at MaxPendingWAN / dropStartFrac
	dropRate      = 0.3
)

// Pre-authentication deadlines: a map gateway's address has as long as
// before for its TLS and HELLO exchange (a long, lossy WAN), a connection
// from any other source strangerAuthTime for TLS: a TLS 1.3 handshake is
// one round trip and the client's flight, well under a second on any WAN,
// so a slow handshake is either a loss burst or a stranger holding a slot.
const (
	wanAuthTime      = 5 * time.Second
	strangerAuthTime = 3 * time.Second
)

// wanSlot is a pending slot an accepted WAN connection holds.
type wanSlot struct {
	src    netip.Addr
	shared bool // from the shared pool (else from src's own)
}

// wanAdmit counts the pending WAN connections of each pool.
type wanAdmit struct {
	mu     sync.Mutex
	own    map[netip.Addr]int // pending from each map gateway address, in its own pool
	other  map[netip.Addr]int // pending in the shared pool, by source
	shared int                // sum of other
	// reserve: the map in force and the own-pool size of each of its
	// gateway addresses (rebuilt when a reload changes the map).
	reserveOf *sitemap.Map
	reserve   map[netip.Addr]int
	nshared   atomic.Int64 // shared, for the gauge
}

// reservedFor is the size of the own pool of each map gateway address of
// m other than this site's: per gateway at that address, twice its links
// (a link and its resume or renewal may cross).
func reservedFor(m *sitemap.Map, self *sitemap.Site, links int) map[netip.Addr]int {
	r := map[netip.Addr]int{}
	for _, s := range m.Sites() {
		if s.ID == self.ID || s.NAT {
			continue
		}
		for _, gw := range s.Gateways {
			r[unmapAP(gw.WAN).Addr()] += max(4, 2*links)
		}
	}
	return r
}

// admitPending takes a pending slot for a connection from src, or returns
// the refusal's reason: wan_pending_source (src has MaxSourcePendingWAN
// in the shared pool), wan_pending (the shared pool is full) or
// wan_early_drop (random early drop).
func (g *Gateway) admitPending(src netip.Addr) (wanSlot, string) {
	a := &g.admit
	m := g.smap.Load()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.reserveOf != m {
		a.reserveOf, a.reserve = m, reservedFor(m, g.site, g.maxLinks())
	}
	if n := a.own[src]; n < a.reserve[src] {
		a.own[src] = n + 1
		return wanSlot{src: src}, ""
	}
	if a.other[src] >= g.cfg.MaxSourcePendingWAN {
		return wanSlot{}, "wan_pending_source"
	}
	full := g.cfg.MaxPendingWAN
	if a.shared >= full {
		return wanSlot{}, "wan_pending"
	}
	if start := full / dropStartFrac; a.shared >= start {
		p := dropRate + (1-dropRate)*float64(a.shared-start)/float64(full-start)
		if rand.Float64() < p {
			return wanSlot{}, "wan_early_drop"
		}
	}
	a.other[src]++
	a.shared++
	a.nshared.Store(int64(a.shared))
	return wanSlot{src: src, shared: true}, ""
}

// release gives s back.
func (g *Gateway) release(s wanSlot) {
	a := &g.admit
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.own
	if s.shared {
		m = a.other
		a.shared--
		a.nshared.Store(int64(a.shared))
	}
	if m[s.src]--; m[s.src] <= 0 {
		delete(m, s.src)
	}
}
