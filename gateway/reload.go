package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
)

// A service gateway lives longer than any job, so its site map changes
// under it: Reload swaps the map in while streams run. The policy checks
// (serve.go) read the current map on every OPEN; peers whose gateway is
// unchanged keep their links; a peer removed from the map, or whose
// gateway moved, stops being dialed and accepted, and its links drain: the
// streams they carry finish (up to RetireTimeout), then the links close. A
// moved peer is then reached at its new address by a fresh peer.

// ReloadResult says what a reload changed, by site name: Reauthenticated
// are the peers whose links were made with a key the new map no longer
// lists (rekey.go); NewKey, whether this gateway's own key changed.
type ReloadResult struct {
	Added, Removed, Moved, Reauthenticated []string
	NewKey                                 bool
}

func (r ReloadResult) String() string {
	if len(r.Added)+len(r.Removed)+len(r.Moved)+len(r.Reauthenticated) == 0 && !r.NewKey {
		return "no peer changed"
	}
	var b []string
	for _, x := range []struct {
		what  string
		names []string
	}{{"added", r.Added}, {"removed", r.Removed}, {"moved", r.Moved}, {"reauthenticated", r.Reauthenticated}} {
		if len(x.names) > 0 {
			b = append(b, x.what+" "+strings.Join(x.names, ","))
		}
	}
	if r.NewKey {
		b = append(b, "this gateway's key changed")
	}
	return strings.Join(b, "; ")
}

// defaultRetireTimeout bounds how long a removed peer's streams may run
// after a reload: long enough for a job to finish, short enough that a
// removed site does not stay reachable for good.
const defaultRetireTimeout = 10 * time.Minute

// errNotRunning: Reload outside Run.
var errNotRunning = errors.New("gateway is not running (starting or draining): reload refused")

// Reload puts m in force. This site must keep its id and its lan=/wan=
// listeners (they are bound sockets: moving them needs a restart);
// everything else may change. On error the old map stays in force.
func (g *Gateway) Reload(m *sitemap.Map) (ReloadResult, error) {
	var res ReloadResult
	s, ok := m.Site(g.site.Name)
	switch {
	case !ok:
		return res, fmt.Errorf("site %q (this gateway's) is not in the new map: put it back, or stop the service to take this gateway out", g.site.Name)
	case s.ID != g.site.ID:
		return res, fmt.Errorf("site %q changes id %d -> %d: peers know a site by its id; restart every gateway to renumber", s.Name, g.site.ID, s.ID)
	case g.gw >= len(s.Gateways) || s.Gateways[g.gw] != g.me:
		return res, fmt.Errorf("site %q no longer lists this gateway (number %d of the site, lan=%v wan=%v) at the same place: restart the service to move or renumber it",
			s.Name, g.gw, g.me.LAN, g.me.WAN)
	case s.NAT != g.site.NAT:
		return res, fmt.Errorf("site %q changes nat=%v -> nat=%v, which decides who dials: restart every gateway to change it", s.Name, g.site.NAT, s.NAT)
	}
	auth, err := g.reloadAuth(m, s)
	if err != nil {
		return res, fmt.Errorf("site map not reloaded: %w", err)
	}
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	if !g.running || g.draining.Load() {
		return res, errNotRunning
	}
	next := map[peerID]*sitemap.Site{}
	for _, ps := range m.Sites() {
		if ps.ID != s.ID {
			for i := range ps.Gateways {
				next[peerID{ps.ID, i}] = ps
			}
		}
	}
	var gone, started []*peer
	g.peersMu.Lock()
	for id, p := range g.peers {
		ns, ok := next[id]
		switch {
		case !ok:
			res.Removed = append(res.Removed, p.name)
		case ns.Name != p.site.Name || ns.Gateways[id.gw].WAN != p.wan || ns.NAT != p.site.NAT:
			// NAT changes which side dials: the links start afresh.
			res.Moved = append(res.Moved, p.name)
		default:
			// The same gateway (name, id, WAN listener): it keeps its links
			// and its record, which holds nothing else the mesh uses.
			continue
		}
		p.removed.Store(true)
		p.wake() // its parked dial loops end
		delete(g.peers, id)
		gone = append(gone, p)
	}
	for id, ns := range next {
		if _, ok := g.peers[id]; ok {
			continue
		}
		p := g.newPeer(ns, id.gw)
		if !contains(res.Moved, p.name) {
			res.Added = append(res.Added, p.name)
		}
		g.peers[id] = p
		started = append(started, p)
	}
	// The map and the peers change together: an OPEN sees either the old
	// pair or the new one (serve.go looks both up under peersMu).
	g.smap.Store(m)
	res.NewKey = g.setAuth(auth)
	g.peersMu.Unlock()
	if t, ok := g.lan.(*MXTransport); ok {
		if t.mapChanged != nil {
			t.mapChanged(m)
		}
		id := g.site.ID
		t.forget(func(a netip.Addr) bool { s, ok := m.Lookup(a); return ok && s.ID == id })
	}
	res.Reauthenticated = g.reauthenticate(m)
	for _, p := range started {
		g.startPeer(p)
	}
	for _, p := range gone {
		g.retire(p)
	}
	g.log.Info("site map reloaded", "changes", res.String(), "sites", len(m.Sites()))
	return res, nil
}

// retire drains a peer that left the map: its streams may finish within
// RetireTimeout (or until the gateway stops), then its links close.
func (g *Gateway) retire(p *peer) {
	g.retireLinks(p, g.linksOf(p)...)
}

// retireLinks drains and closes links of the removed peer p, on a
// goroutine the gateway's stop waits for.
func (g *Gateway) retireLinks(p *peer, links ...*relay.Link) {
	// Out of p's slots first: the close of a link still in its slot is
	// logged as a lost link whose streams were reset, which these are not.
	g.peersMu.Lock()
	for i, x := range p.links {
		if slices.Contains(links, x) {
			p.links[i] = nil
		}
	}
	g.peersMu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		ctx, cancel := context.WithTimeout(g.ctx, g.cfg.RetireTimeout)
		defer cancel()
		// A link being primed has PAD frames queued, which closing it
		// mid-way trips over in relay (Link.fail and a PAD's nil stream):
		// let priming end first (tuning.PrimeMaxTime at most).
		p.primeMu.Lock()
		p.primeMu.Unlock()
		streams := p.trunk.NumStreams()
		start := time.Now()
		for _, l := range links {
			l.Drain(ctx)
		}
		for _, l := range links {
			l.Close()
		}
		g.log.Info("removed peer's WAN links closed", "peer", p.name, "links", len(links), "streams_at_reload", streams,
			"drained_in", time.Since(start).Round(time.Millisecond).String(), "cut_short", ctx.Err() != nil)
	}()
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
