package gateway

// The peer table: one peer per gateway host of every other site in the map
// in force (curMap), made by New and Reload (newPeer), with its links by
// index (bulk links, then the express link) and the counters that outlive
// a link. The WAN side (wan.go, wan_accept.go) installs links in it
// (setLink); the LAN side takes a link from it for each new stream
// (pickLink); readiness (setReady, allUp, upFor) is read off it.

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
)

// peerID names a peer: a gateway host of another site, by the site's id
// and the host's index in its Gateways.
type peerID struct {
	site uint8
	gw   int
}

// peer is a gateway host of another site and our links to it. Every
// gateway pair of two sites keeps its own links: the site's other
// gateways are other peers.
type peer struct {
	site   *sitemap.Site
	gw     int            // index in site.Gateways
	wan    netip.AddrPort // its WAN listener
	name   string         // for logs and metrics: the site's name, with "/N" for gateway N > 0
	dialer bool           // we dial (sitemap.Dials: the peer is behind NAT, or our id is lower)
	trunk  *relay.Trunk   // the links' shared streams
	links  []*relay.Link  // by link index (bulk links, then the express link); nil while down
	// lay is the pair's layout (trunk.go): the gateway's own until a
	// HELLO agrees on another; layoutc (under peersMu) is closed when it
	// changes, which wakes the dial loops it parked.
	lay     atomic.Pointer[layout]
	layoutc chan struct{}
	// adding (under peersMu) counts the links being added under lay
	// (adopt): it holds lay as a link does.
	adding int
	// renew wakes the dialer's express dialLoop to replace a working
	// express link; renewed counts renewals (both sides).
	renew   chan struct{}
	renewed atomic.Uint64
	// yields counts the holds of the express link (stepExpress).
	yields atomic.Uint64
	// streamsIn: streams the peer has open into this site (MaxPeerStreams).
	streamsIn atomic.Int64
	// renewAccepted: when the acceptor last let a new express link retire
	// a working one (unix ns).
	renewAccepted atomic.Int64
	// primeMu: one link of the pair primes at a time, so each measures
	// the path's rate rather than a share of it (tuning.Prime).
	primeMu sync.Mutex
	// removed: a reload took the peer out of the map (reload.go); its
	// links drain and are not redialed.
	removed atomic.Bool
	// past and leaving (under peersMu), by link index, carry the counters
	// of the links a slot held before, so that the metrics count over the
	// peer's life: an express link is renewed as often as every second,
	// and a summary read after a renewal saw only the new link's bytes.
	// past sums the closed ones; leaving are replaced ones still closing
	// (a retiring link writes its queue first).
	past    []linkCounts
	leaving [][]*relay.Link
}

// newPeer makes the peer state for gateway gw of site s (not started).
// Who dials is the sites' rule (sitemap.Dials) for every gateway pair.
func (g *Gateway) newPeer(s *sitemap.Site, gw int) *peer {
	n := g.maxLinks()
	p := &peer{site: s, gw: gw, wan: s.Gateways[gw].WAN, name: peerName(s.Name, gw),
		dialer: sitemap.Dials(g.site, s), links: make([]*relay.Link, n), renew: make(chan struct{}, 1),
		past: make([]linkCounts, n), leaving: make([][]*relay.Link, n), layoutc: make(chan struct{})}
	p.lay.Store(g.mine)
	p.trunk = relay.NewTrunk(p.dialer, relay.HandlerFunc(g.openFromWAN))
	p.trunk.OnRenew(func() { kickRenew(p) })
	return p
}

// peerName names gateway gw of site in logs and metrics: the site's name,
// with "/N" for its gateway N > 0.
func peerName(site string, gw int) string {
	if gw == 0 {
		return site
	}
	return fmt.Sprintf("%s/%d", site, gw)
}

// isExpress tells whether p's link index i is the express link.
func (p *peer) isExpress(i int) bool { return p.lay.Load().isExpress(i) }

// inLayout is p's links of its layout (caller holds peersMu): the slots
// past it are empty.
func (p *peer) inLayout() []*relay.Link { return p.links[:p.lay.Load().numLinks()] }

// wake closes layoutc (caller holds peersMu): the parked dial loops look
// again.
func (p *peer) wake() {
	close(p.layoutc)
	p.layoutc = make(chan struct{})
}

// linkCounts are the counters of relay.Stats that the metrics carry over
// from one link of a slot to the next.
type linkCounts struct{ bytesTx, bytesRx, padTx, padRx, framesTx, framesRx uint64 }

func (c *linkCounts) add(l *relay.Link) {
	st := &l.Stats
	c.bytesTx += st.BytesSent.Load()
	c.bytesRx += st.BytesRecv.Load()
	c.padTx += st.PadSent.Load()
	c.padRx += st.PadRecv.Load()
	c.framesTx += st.FramesSent.Load()
	c.framesRx += st.FramesRecv.Load()
}

// pastCounts is what slot i's earlier links counted; peersMu held.
func (p *peer) pastCounts(i int) linkCounts {
	c := p.past[i]
	for _, l := range p.leaving[i] {
		c.add(l)
	}
	return c
}

// curMap is the site map in force.
func (g *Gateway) curMap() *sitemap.Map { return g.smap.Load() }

// peer returns the current peer k, or nil.
func (g *Gateway) peer(k peerID) *peer {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	return g.peers[k]
}

// peersOf returns the current peers of site id (its gateway hosts), by
// gateway index. The indices run from 0 without a gap (New and Reload
// make one peer per entry of the site's Gateways), so the lookup costs a
// site's gateways, not a scan of every peer at each stream's open.
func (g *Gateway) peersOf(id uint8) []*peer {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	var ps []*peer
	for i := 0; ; i++ {
		p := g.peers[peerID{id, i}]
		if p == nil {
			return ps
		}
		ps = append(ps, p)
	}
}

// peerList is a snapshot of the current peers.
func (g *Gateway) peerList() []*peer {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	ps := make([]*peer, 0, len(g.peers))
	for _, p := range g.peers {
		ps = append(ps, p)
	}
	return ps
}

// linksOf is a snapshot of p's links that exist now.
func (g *Gateway) linksOf(p *peer) []*relay.Link {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	links := make([]*relay.Link, 0, len(p.links))
	for _, l := range p.links {
		if l != nil {
			links = append(links, l)
		}
	}
	return links
}

func (g *Gateway) allLinks() []*relay.Link {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	var ls []*relay.Link
	for _, p := range g.peers {
		for _, l := range p.links {
			if l != nil {
				ls = append(ls, l)
			}
		}
	}
	return ls
}

// sitesLocked groups the peers by site name: each site's gateway hosts
// (caller holds peersMu).
func (g *Gateway) sitesLocked() map[string][]*peer {
	byName := map[string][]*peer{}
	for _, p := range g.peers {
		byName[p.site.Name] = append(byName[p.site.Name], p)
	}
	return byName
}

// setLink installs l as p's link i. priming: l is about to be primed, and
// the gateway is not ready until primeLink has finished with it.
func (g *Gateway) setLink(p *peer, i int, l *relay.Link, priming bool) {
	g.peersMu.Lock()
	old := p.links[i]
	p.links[i] = l
	replaced := old != nil && old != l
	if replaced {
		p.leaving[i] = append(p.leaving[i], old)
	}
	if priming {
		g.priming++
	}
	all := g.allUpLocked()
	g.peersMu.Unlock()
	if replaced {
		old.OnClose(func(error) {
			g.peersMu.Lock()
			p.leaving[i] = slices.DeleteFunc(p.leaving[i], func(x *relay.Link) bool { return x == old })
			p.past[i].add(old)
			g.peersMu.Unlock()
		})
	}
	if !p.dialer && l.Resumable() {
		go g.watchDown(p, l)
	}
	// A renewal is counted by the new link: the retired one may already
	// have closed (and left the slot nil) when both RETIREs crossed
	// before we got here.
	if l.Renews() {
		p.renewed.Add(1)
	}
	switch {
	case old == nil || old == l:
	case old.Retiring(): // renewed: it closes itself once RETIRE has crossed
	default:
		old.Close()
	}
	if all {
		g.setReady()
	}
	l.OnClose(func(err error) {
		g.peersMu.Lock()
		lost := p.links[i] == l
		if lost {
			p.links[i] = nil
			p.past[i].add(l)
		}
		g.peersMu.Unlock()
		if lost && !g.draining.Load() {
			// Failed for good (down longer than --wan-resume-within, the
			// peer restarted, or no resume): each stream through it is
			// reset (code 7), and its rank sees its connection fail.
			g.log.Warn("WAN link lost: streams through it were reset; MPI jobs using them fail",
				"peer", p.name, "link", i, "err", err)
		}
	})
}

// pickLink returns the up bulk link to one of ps (the gateways of a
// site) with the fewest streams homed on it, waiting up to OpenTimeout
// for one to come up. Streams so spread over the peer site's gateway
// hosts by load (streams open). A link that is down (waiting to resume)
// is taken only when no link is up: its stream waits for the resume, as
// it did with one gateway per site, while a peer gateway host that died
// gets no new stream. Ties go round robin (the scan starts one link
// further each time), so short streams that end before the next opens
// spread too. The express link homes no stream: it must stay free for
// small frames.
func (g *Gateway) pickLink(ps []*peer) *relay.Link {
	deadline := time.Now().Add(g.cfg.OpenTimeout)
	start := int(g.spread.Add(1))
	for {
		var best *relay.Link
		bestN, bestDown := 0, false
		g.peersMu.Lock()
		var bulk []*relay.Link // bulk links come first
		for _, p := range ps {
			bulk = append(bulk, p.links[:p.lay.Load().conns]...)
		}
		for k := range bulk {
			l := bulk[(start+k)%len(bulk)]
			if l == nil {
				continue
			}
			n, down := l.NumStreams(), l.Down()
			if best == nil || bestDown && !down || down == bestDown && n < bestN {
				best, bestN, bestDown = l, n, down
			}
		}
		g.peersMu.Unlock()
		if best != nil || time.Now().After(deadline) {
			return best
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-g.ctx.Done():
			return nil
		}
	}
}

func (g *Gateway) setReady() {
	g.peersMu.Lock()
	first := !g.ready
	g.ready = true
	g.peersMu.Unlock()
	if !first {
		return
	}
	if g.cfg.ReadyFile != "" {
		if err := os.WriteFile(g.cfg.ReadyFile, []byte(fmt.Sprintf("ready %s %d\n", g.site.Name, os.Getpid())), 0o644); err != nil {
			g.log.Error("cannot write ready file", "path", g.cfg.ReadyFile, "err", err)
		}
	}
	close(g.readyc) // after the file, so whoever waits on Ready can read it
	g.log.Info("ready: every WAN link is up (and primed)")
}

// allUp reports whether every peer site can be reached now, none of our
// links being primed (the /ready endpoint): some gateway of each site has
// every link up. With one gateway per site, every link is up.
func (g *Gateway) allUp() bool {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	return g.priming == 0 && g.linksUpLocked() == nil
}

// linksUp says why some peer site cannot be reached now, priming or not
// (/ready?primed=0); nil when every one can.
func (g *Gateway) linksUp() error {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	return g.linksUpLocked()
}

func (g *Gateway) linksUpLocked() error {
	for _, ps := range g.sitesLocked() {
		if err := siteUpLocked(ps); err != nil {
			return err
		}
	}
	return nil
}

// allUpLocked: every link is up and none is being primed.
func (g *Gateway) allUpLocked() bool {
	if g.priming > 0 {
		return false
	}
	for _, p := range g.peers {
		for _, l := range p.inLayout() {
			if l == nil {
				return false
			}
		}
	}
	return true
}

// upFor reports whether every link to the named sites is up (this site's
// own name is skipped): a site the map does not name, or a link down, is
// the error.
func (g *Gateway) upFor(names []string) error {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	byName := g.sitesLocked()
	for _, n := range names {
		if n == g.site.Name || n == "" {
			continue
		}
		ps := byName[n]
		if len(ps) == 0 {
			return fmt.Errorf("site %s is not in this gateway's site map", n)
		}
		if err := siteUpLocked(ps); err != nil {
			return err
		}
	}
	return nil
}

// siteUpLocked: some gateway of a site (its peers ps) has every link up,
// so streams to the site can go; a gateway host of a site that is down
// does not make the site unreachable (caller holds peersMu).
func siteUpLocked(ps []*peer) error {
	var err error
	for _, p := range ps {
		err = nil
		for i, l := range p.inLayout() {
			if l == nil {
				err = fmt.Errorf("WAN link %d to %s is down", i, p.name)
				break
			}
		}
		if err == nil {
			return nil
		}
	}
	return err
}

// peerCount is how many peers a gateway of site self has: every gateway
// host of every other site of m.
func peerCount(m *sitemap.Map, self *sitemap.Site) int {
	n := 0
	for _, s := range m.Sites() {
		if s.ID != self.ID {
			n += len(s.Gateways)
		}
	}
	return n
}

// initPeers puts the configured map in force and makes a peer of every
// gateway host of its other sites (Run starts them).
func (g *Gateway) initPeers() {
	g.smap.Store(g.cfg.Map)
	for _, s := range g.cfg.Map.Sites() {
		if s.ID != g.site.ID {
			for i := range s.Gateways {
				g.peers[peerID{s.ID, i}] = g.newPeer(s, i)
			}
		}
	}
}
