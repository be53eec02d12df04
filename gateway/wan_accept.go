package gateway

// The accepting side of the WAN mesh (sitemap.Dials: the peer with the
// lower site id, or the one behind NAT, dials). A connection passes:
//
//  1. serveWAN: accepted, and given a pending slot (admit.go) or reset.
//  2. acceptWAN: authenticated, by key over TLS or by its source address
//     (admitWAN, peerauth.go).
//  3. acceptWAN's HELLO answer: a new link (linkInUse) or the resume of a
//     known one (resumable; renewAllowed for an express link's renewal).
//  4. addLink or resumed (wan.go): the link joins the peer's trunk.
//
// watchDown then fails an accepted link whose dialer has died.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
)

func (g *Gateway) serveWAN() {
	defer g.wg.Done()
	acceptEach(g, "wan", g.wanLn.AcceptTCP, func(c *net.TCPConn) {
		src := unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort()).Addr()
		slot, reason := g.admitPending(src)
		if reason != "" {
			g.refused(reason, "WAN connection refused before authentication: "+pendingWhy[reason],
				"remote", c.RemoteAddr().String(), "limit", g.cfg.MaxPendingWAN, "per_source", g.cfg.MaxSourcePendingWAN)
			g.m.wanRefused.Inc()
			c.SetLinger(0)
			c.Close()
			return
		}
		g.wanPending.Add(1)
		go func() {
			defer g.release(slot)
			defer g.wanPending.Add(-1)
			g.acceptWAN(c, slot.shared)
		}()
	})
}

// pendingWhy says what each admission refusal means.
var pendingWhy = map[string]string{
	"wan_pending_source": "this source has MaxSourcePendingWAN connections in their handshake already",
	"wan_pending":        "MaxPendingWAN connections from sources that are no map gateway's address are in their handshake",
	"wan_early_drop":     "dropped at random: more than half of MaxPendingWAN connections from sources that are no map gateway's address are in their handshake",
}

// acceptLag bounds how long an established WAN connection waits in the
// accept queue before acceptWAN runs.
const acceptLag = 20 * time.Millisecond

// acceptWAN admits a peer gateway of a site with a higher id than ours:
// one that proves a key the map lists for that site (keyed maps, any
// source address), or whose source address is that site's WAN address
// (keyless maps); its HELLO must name that site.
//
// stranger: its source is no map gateway's address, and it has
// strangerAuthTime to authenticate.
func (g *Gateway) acceptWAN(tc *net.TCPConn, stranger bool) {
	// The kernel established the connection just before accept returned
	// (the accept loop never lags by more than a scheduling delay).
	since := time.Now().Add(-acceptLag)
	remote := unmapAP(tc.RemoteAddr().(*net.TCPAddr).AddrPort())
	ctx, cancel := context.WithTimeout(g.ctx, wanAuthTime)
	defer cancel()
	actx := ctx
	if stranger {
		var acancel context.CancelFunc
		actx, acancel = context.WithTimeout(ctx, strangerAuthTime)
		defer acancel()
	}
	c, cands, reason, err := g.admitWAN(actx, tc, remote)
	if err != nil {
		if errors.Is(actx.Err(), context.DeadlineExceeded) {
			budget, whose := wanAuthTime, "a map gateway's address"
			if stranger {
				budget, whose = strangerAuthTime, "a source that is no map gateway's address"
			}
			err = fmt.Errorf("no TLS handshake within %v, the time %s has: %w", budget, whose, err)
		}
		g.refused(reason, "WAN connection refused", "remote", remote.String(), "err", err)
		g.m.wanRefused.Inc()
		tc.SetLinger(0)
		tc.Close()
		return
	}
	var p *peer
	var resume *relay.Link // the link the HELLO resumes, if any
	var local uint64       // the session our HELLO gives a new link
	parked := false        // the link is not in the agreed layout: we answer and close
	var adopted func()     // holds the pair's layout until the link is in (adopt)
	reason = "wan_hello"
	ph, err := relay.Answer(ctx, c, func(ph header.Hello) (header.Hello, error) {
		for _, q := range cands {
			if q.site.ID == ph.SiteID && q.gw == int(ph.Gateway) {
				p = q
			}
		}
		i := int(ph.LinkIndex)
		switch {
		case p == nil && g.auth != nil:
			return header.Hello{}, fmt.Errorf("HELLO claims gateway %d of site id %d, but the peer proved the key of site %s, which lists %d gateways",
				ph.Gateway, ph.SiteID, cands[0].site.Name, len(cands[0].site.Gateways))
		case p == nil:
			return header.Hello{}, fmt.Errorf("HELLO claims gateway %d of site id %d, which does not have WAN address %v", ph.Gateway, ph.SiteID, remote.Addr())
		}
		// checkHello first: a peer with another link count learns which
		// flags differ, not only that its index is out of range.
		lay, err := g.checkHello(ph, p, i)
		if err != nil {
			return header.Hello{}, err
		}
		adopted, err = g.adopt(p, lay, i)
		switch {
		case errors.Is(err, errParked) && ph.TrunkAuto:
			// An auto dialer learns the agreed layout from our answer,
			// and parks the link.
			parked = true
			return g.hello(p, 0), nil
		case errors.Is(err, errParked):
			return header.Hello{}, fmt.Errorf("link index %d with %d links per site pair", ph.LinkIndex, lay.numLinks())
		case err != nil:
			reason = "wan_trunk_change"
			return header.Hello{}, err
		}
		if ph.Resume {
			l, err := g.resumable(p, i, ph.Session, ph.Renew)
			if err != nil {
				reason = "wan_link_in_use"
				return header.Hello{}, err
			}
			if l != nil {
				if h, err := l.ResumeHello(g.hello(p, i)); err == nil {
					resume = l
					return h, nil
				}
			}
			// Not a link we know (we restarted, or it failed for good):
			// our answer without Resume makes it a new link on both sides.
		} else if err := g.linkInUse(p, i); err != nil {
			reason = "wan_link_in_use"
			return header.Hello{}, err
		}
		h := g.hello(p, i)
		local = h.Session
		return h, nil
	})
	if adopted != nil {
		defer adopted()
	}
	if err != nil {
		g.refused(reason, "WAN connection refused", "remote", remote.String(), "err", err)
		g.m.wanRefused.Inc()
		tc.SetLinger(0)
		c.Close()
		return
	}
	i := int(ph.LinkIndex)
	if parked {
		g.log.Debug("WAN link not in the agreed layout: answered and closed", "peer", p.name, "link", i, "trunk", p.lay.Load().preset)
		c.Close()
		return
	}
	if resume != nil {
		if err := g.resumed(p, i, resume, c, ph, since); err != nil {
			g.log.Warn("WAN link resume failed", "peer", p.name, "link", i, "remote", remote.String(), "err", err)
			tc.SetLinger(0)
			c.Close()
		} else if ph.Renew {
			p.renewed.Add(1)
			g.log.Debug("express link renewed", "peer", p.name, "link", i, "remote", remote.String())
		}
		return
	}
	g.addLink(p, i, c, ph, since, local)
	g.log.Info("WAN link up", "peer", p.name, "link", ph.LinkIndex, "remote", remote.String())
}

// watchDown fails an accepted link that stays down while no gateway
// listens at the peer's WAN address. Only the dialer reconnects, so a
// dialer that died (its sockets reset rather than closed) leaves nothing
// to resume the link, and its streams would wait --wan-resume-within. A
// link the dialer resumes within a second is never probed; a path that
// does not answer (a blackhole, a NAT) proves nothing and the link waits.
func (g *Gateway) watchDown(p *peer, l *relay.Link) {
	if p.site.NAT {
		return // its wan= address is not where it can be reached: a probe proves nothing
	}
	for {
		select {
		case <-l.Breaks():
		case <-l.Done():
			return
		case <-g.ctx.Done():
			return
		}
		// Probe once the link has been down for a second without a
		// resume, then every 5 s: an express link's renewal takes it down
		// for one HELLO exchange once per relay.RenewGap, so a link that
		// is merely down at the moment of a check proves nothing.
		for probeAt := time.Second; ; probeAt += 5 * time.Second {
			if !g.downFor(l, probeAt) {
				break
			}
			d := net.Dialer{Timeout: 2 * time.Second}
			c, err := d.DialContext(g.ctx, "tcp", p.wan.String())
			if errors.Is(err, syscall.ECONNREFUSED) {
				// Confirmed by a second probe, as the dialer's resume does.
				time.Sleep(50 * time.Millisecond)
				c, err = d.DialContext(g.ctx, "tcp", p.wan.String())
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				g.log.Warn("WAN link cannot resume: the peer gateway is not running; its streams are reset",
					"peer", p.name, "link", l.Index(), "addr", p.wan.String())
				l.Close()
				return
			}
			if err == nil {
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		}
	}
}

// downLink is what downFor reads of a link.
type downLink interface {
	ResumeStats() relay.ResumeStats
	Done() <-chan struct{}
}

// downFor waits until link l has been down for d since its last break,
// and reports whether it has; false: it resumed, or it or the gateway
// ended.
func (g *Gateway) downFor(l downLink, d time.Duration) bool {
	for {
		st := l.ResumeStats()
		if !st.Down {
			return false
		}
		if st.DownFor >= d {
			return true
		}
		select {
		case <-time.After(d - st.DownFor):
		case <-l.Done():
			return false
		case <-g.ctx.Done():
			return false
		}
	}
}

// resumable returns p's link i if its session is session, taking down
// its connection if this side has not yet seen it break: the dialer saw
// it fail first, and reconnects, or it renews the link (renew), which
// renewAllowed may refuse.
func (g *Gateway) resumable(p *peer, i int, session uint64, renew bool) (*relay.Link, error) {
	g.peersMu.Lock()
	l := p.links[i]
	g.peersMu.Unlock()
	if l == nil || !l.Resumable() || l.Session() != session {
		return nil, nil
	}
	switch {
	case l.Down():
	case renew:
		if err := g.renewAllowed(p, i); err != nil {
			return nil, err
		}
		l.Break(relay.ErrRenewal)
	default:
		l.Break(errors.New("relay: the peer resumes the link on a new connection"))
	}
	return l, nil
}

// renewAllowed refuses a renewal of p's link i that is not the express
// link of a gateway that renews, or that comes less than half
// relay.RenewGap after the last: the dialer waits relay.RenewGap between
// two, so more are a peer gone wrong, and each costs the link a HELLO
// exchange.
func (g *Gateway) renewAllowed(p *peer, i int) error {
	if lay := p.lay.Load(); !lay.isExpress(i) || !lay.renew {
		return fmt.Errorf("renewal of link %d, which is not an express link that renews", i)
	}
	now := time.Now().UnixNano()
	last := p.renewAccepted.Load()
	if now-last < int64(relay.RenewGap/2) || !p.renewAccepted.CompareAndSwap(last, now) {
		return fmt.Errorf("express link %d was renewed %v ago: at most one renewal per %v", i,
			time.Duration(now-last).Round(time.Millisecond), relay.RenewGap/2)
	}
	return nil
}

// linkInUse refuses a new connection for p's link i while the link it
// would replace still works: a forged or stray HELLO must not reset every
// stream of a working link. The dialer reconnects only after its link
// failed, and then the old link here is closed, or is found dead by a
// PING that gets no answer within probeWait. An express link may be
// renewed while it works (its streams survive the retirement), at most
// once per half relay.RenewGap.
func (g *Gateway) linkInUse(p *peer, i int) error {
	g.peersMu.Lock()
	old := p.links[i]
	g.peersMu.Unlock()
	if old == nil {
		return nil
	}
	select {
	case <-old.Done():
		return nil // failed: the peer reconnects
	default:
	}
	if old.Down() {
		return nil // broken, and the peer starts afresh instead of resuming it
	}
	if lay := p.lay.Load(); lay.isExpress(i) && lay.renew {
		return g.renewAllowed(p, i)
	}
	wait := max(probeWait, 4*time.Duration(old.Stats.RTT.Load()))
	if old.Alive(min(wait, g.cfg.DeadAfter)) {
		return fmt.Errorf("link %d to %s is up and answers: a new link replaces it only once it has failed", i, p.name)
	}
	return nil
}

// probeWait is the least time a link that a new connection would replace
// gets to answer a PING.
const probeWait = 500 * time.Millisecond
