package gateway

// The dialing side of the WAN mesh (sitemap.Dials: the peer with the
// lower site id, or the one behind NAT), and the HELLO both sides send.
// Each link this side dials is kept up by
//
//  1. startPeer: one dialLoop per link index of the peer;
//  2. dialLoop: dial, then redial after a failure, with backoff;
//  3. dialOnce, dialHello, dialSecure: TCP from the map address, then TLS
//     when the map has keys (secureDial, peerauth.go);
//  4. helloOn: the HELLO exchange (hello, checkHello), which agrees on
//     the pair's layout (trunk.go: agree; adopt; a link index the layout
//     does not have parks its dialLoop);
//  5. addLink: the link joins the peer's trunk and its slot (setLink,
//     peers.go), tuned (wan_tune.go);
//  6. resumeLoop, when its connection breaks: redial and resume the link
//     on the new connection (resumed). An express link's renewal
//     (kickRenew) takes the same path (renewByResume), or, without
//     resume, dials a successor and retires the old link.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
)

// features is what the HELLO of a link of layout l says.
func (g *Gateway) features(l *layout) uint8 {
	f := header.FeatureTrunk | header.FeatureClamp | header.FeaturePad | header.FeatureQuiet
	if _, ok := g.lan.(*MXTransport); ok {
		f |= header.FeatureNodeResume
	}
	if g.cfg.ResumeWithin > 0 {
		f |= header.FeatureResume
	}
	if l.express {
		f |= header.FeatureExpress
		if l.renew {
			f |= header.FeatureRenew
		}
	}
	return f
}

// hello is the HELLO of a new link i to p, in p's layout; a resuming
// link gets a fresh session (never 0).
func (g *Gateway) hello(p *peer, i int) header.Hello {
	return g.helloIn(p.lay.Load(), i)
}

func (g *Gateway) helloIn(l *layout, i int) header.Hello {
	h := l.rcfg.Hello(g.site.ID, g.site.Name, uint8(i), uint8(l.numLinks()))
	h.Features = g.features(l)
	h.Gateway = uint8(g.gw)
	h.Trunk, h.TrunkAuto = l.wire(), g.alt != nil
	if h.Features&header.FeatureResume != 0 {
		h.Session = rand.Uint64() | 1
	}
	return h
}

// trunkSaid names the gateway's --wan-trunk preset and, for auto, what
// it picked and why.
func (g *Gateway) trunkSaid() string {
	if g.cfg.TrunkCC != "" {
		return fmt.Sprintf("--wan-trunk auto, which picked %s: this host's TCP is %s", g.cfg.Trunk, g.cfg.TrunkCC)
	}
	if g.cfg.Trunk == "" {
		return "no --wan-trunk preset"
	}
	return "--wan-trunk " + g.cfg.Trunk
}

// checkHello checks the HELLO h of p's gateway and returns the layout
// the pair agrees on (agree). i >= 0: h is a dialer's for link i, whose
// links may be those of the layout it leaves when it runs auto (it takes
// the agreed one from our answer); i < 0: h is the acceptor's answer,
// which states the agreed layout.
func (g *Gateway) checkHello(h header.Hello, p *peer, i int) (*layout, error) {
	switch {
	case h.SiteID != p.site.ID:
		return nil, fmt.Errorf("peer says it is site id %d, want %d", h.SiteID, p.site.ID)
	case h.Name != p.site.Name:
		return nil, fmt.Errorf("peer says it is site %q, want %q", h.Name, p.site.Name)
	case int(h.Gateway) != p.gw:
		return nil, fmt.Errorf("peer says it is gateway %d of site %s, want %d (%v)", h.Gateway, p.site.Name, p.gw, p.wan)
	case i >= 0 && int(h.LinkIndex) != i:
		return nil, fmt.Errorf("peer link index %d, want %d", h.LinkIndex, i)
	}
	l, err := g.agree(h)
	if err != nil {
		return nil, err
	}
	if !g.states(l, h) && (i < 0 || !h.TrunkAuto) {
		// NODE_RESUME says what the sender's LAN is, which differs
		// between sites.
		return nil, fmt.Errorf("peer has %d links per site pair (features %#x) for the %s trunk, we have %d (features %#x, %s): "+
			"run the same mpi5k build with the same --wan-trunk, --wan-conns, --wan-express, --wan-express-renew and --wan-resume-within on every gateway",
			h.LinkCount, h.Features, l.preset, l.numLinks(), g.features(l), g.trunkSaid())
	}
	return l, nil
}

// startPeer starts dialing p's links if this side dials. Callers hold
// reloadMu with the gateway running, so g.wg cannot be waited on yet.
func (g *Gateway) startPeer(p *peer) {
	if !p.dialer {
		return
	}
	for i := range p.links { // every index of every layout: parked() holds those not in p's
		g.wg.Add(1)
		go g.dialLoop(p, i)
	}
}

// dialLoop keeps link i to p up: dial, handshake, run until it dies,
// reconnect with capped exponential backoff plus jitter.
func (g *Gateway) dialLoop(p *peer, i int) {
	defer g.wg.Done()
	backoff := 50 * time.Millisecond
	log := g.log.With("peer", p.name, "link", i)
	for g.ctx.Err() == nil && !p.removed.Load() {
		if wait := g.parked(p, i); wait != nil {
			select {
			case <-wait:
			case <-g.ctx.Done():
				return
			}
			continue
		}
		l, err := g.dialOnce(p, i)
		if errors.Is(err, errParked) {
			log.Debug("WAN link not in the agreed layout: parked", "trunk", p.lay.Load().preset)
			continue
		}
		if err != nil {
			// The first failures are normal while peers start up.
			lvl := slog.LevelDebug
			if backoff >= 400*time.Millisecond {
				lvl = slog.LevelWarn
			}
			log.Log(g.ctx, lvl, "WAN dial failed", "addr", p.wan.String(), "err", err, "retry_in", backoff.String())
			g.m.wanDialFailures.Inc()
			select {
			case <-time.After(backoff + rand.N(backoff/2+1)):
			case <-g.ctx.Done():
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		if p.removed.Load() { // removed while dialing: retire missed this link
			g.retireLinks(p, l)
			return
		}
		backoff = 50 * time.Millisecond
		log.Info("WAN link up", "remote", l.Conn().RemoteAddr().String())
		var lastRenew time.Time
		var later <-chan time.Time
		var renew chan struct{} // only the express link's loop renews
		if p.isExpress(i) {
			renew = p.renew
		}
		for l != nil {
			select {
			case <-l.Breaks():
				l = g.resumeLoop(p, i, l, log, nil, time.Time{})
			case <-l.Done():
				if g.draining.Load() || p.removed.Load() {
					return
				}
				log.Info("reconnecting the lost WAN link", "err", l.Err())
				l = nil
			case <-later:
				later = nil
				kickRenew(p)
			case <-renew:
				// At most one renewal per relay.RenewGap, whoever asks; a
				// request that comes sooner waits for the gap to pass.
				if g.draining.Load() || p.removed.Load() || later != nil {
					continue
				}
				if wait := relay.RenewGap - time.Since(lastRenew); wait > 0 {
					later = time.After(wait)
					continue
				}
				lastRenew = time.Now()
				if l.Resumable() {
					l = g.renewByResume(p, i, l, log)
					continue
				}
				// The old link retires once the new one is in its place
				// (relay.Trunk.Add); if the dial fails it simply stays.
				if nl, err := g.dialOnce(p, i); err != nil {
					log.Warn("express link renewal failed; keeping the old link", "err", err)
				} else {
					log.Debug("express link renewed", "remote", nl.Conn().RemoteAddr().String())
					l = nl
				}
			case <-g.ctx.Done():
				return
			}
		}
	}
}

func kickRenew(p *peer) {
	select {
	case p.renew <- struct{}{}:
	default:
	}
}

func (g *Gateway) dialOnce(p *peer, i int) (*relay.Link, error) {
	h := g.hello(p, i)
	c, ph, l, since, err := g.dialHello(p, h)
	if err != nil {
		return nil, err
	}
	done, err := g.adopt(p, l, i)
	if err != nil {
		c.Close()
		return nil, err
	}
	defer done()
	return g.addLink(p, i, c, ph, since, h.Session), nil
}

// dialHello connects to p's gateway, runs TLS over the connection when
// the map has keys, and exchanges HELLOs, ours h: the peer's HELLO, and
// the layout the pair agrees on; since is a time before the connection
// was established.
func (g *Gateway) dialHello(p *peer, h header.Hello) (net.Conn, header.Hello, *layout, time.Time, error) {
	c, since, err := g.dialSecure(p)
	if err != nil {
		return nil, header.Hello{}, nil, since, err
	}
	ph, l, err := g.helloOn(c, p, h)
	if err != nil {
		c.Close()
		return nil, ph, nil, since, err
	}
	return c, ph, l, since, nil
}

// dialSecure connects to p's gateway and runs TLS over the connection when
// the map has keys; since is a time before the connection was established.
func (g *Gateway) dialSecure(p *peer) (net.Conn, time.Time, error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: g.wanCreate().Control(nil)}
	// A keyless acceptor checks our source address; a keyed one takes a
	// connection from our map address from a pool of pending slots no
	// stranger can take (admit.go), so we dial from there when it is one
	// of this host's, and from wherever the route says when it is not (a
	// site behind NAT, an address the host does not hold).
	bind := g.auth == nil || !g.site.NAT
	if bind {
		d.LocalAddr = &net.TCPAddr{IP: g.me.WAN.Addr().AsSlice()}
	}
	since := time.Now()
	tc, err := d.DialContext(g.ctx, "tcp", p.wan.String())
	if err != nil && bind && g.auth != nil && errors.Is(err, syscall.EADDRNOTAVAIL) {
		d.LocalAddr = nil
		since = time.Now()
		tc, err = d.DialContext(g.ctx, "tcp", p.wan.String())
	}
	if err != nil {
		return nil, since, err
	}
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	c, err := g.secureDial(ctx, tc.(*net.TCPConn), p)
	if err != nil {
		tc.Close()
		return nil, since, err
	}
	return c, since, nil
}

// helloOn exchanges HELLOs, ours h, on c, a connection to p's gateway,
// and returns the layout the pair agrees on.
func (g *Gateway) helloOn(c net.Conn, p *peer, h header.Hello) (header.Hello, *layout, error) {
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	ph, err := relay.Handshake(ctx, c, h)
	if err != nil {
		return ph, nil, err
	}
	// The acceptor's index is informational: only the dialer's is
	// meaningful.
	l, err := g.checkHello(ph, p, -1)
	return ph, l, err
}

// addLink joins conn to p's trunk as link i; local is the session our
// HELLO gave it (0: none, the link does not resume).
//
// since is a time before the TCP connection was established: the PROBE_RTT
// guard starts its BBR min_rtt clock there.
func (g *Gateway) addLink(p *peer, i int, c net.Conn, ph header.Hello, since time.Time, local uint64) *relay.Link {
	lay := p.lay.Load() // adopted before: it changes only while the pair has no link
	x := lay.isExpress(i)
	g.tuneLink(p, i, c)
	var l *relay.Link
	if local != 0 && ph.Session != 0 {
		l = p.trunk.AddResumable(c, lay.rcfg, ph, i, x, local)
	} else {
		l = p.trunk.Add(c, lay.rcfg, ph, i, x)
	}
	if !x && lay.guard {
		g.guard.Begin(l, since) // before setLink publishes l to the guard
	}
	g.setLink(p, i, l, lay.prime)
	if lay.prime {
		go g.primeLink(p, i, x, l)
	}
	return l
}

// resumed moves link l of p onto the new connection c, whose HELLO
// exchange (ph) resumed it. A resumed connection is not primed: its
// streams are waiting, and they are what fills it.
func (g *Gateway) resumed(p *peer, i int, l *relay.Link, c net.Conn, ph header.Hello, since time.Time) error {
	g.tuneLink(p, i, c)
	if err := l.Resume(c, ph); err != nil {
		return err
	}
	if lay := p.lay.Load(); !lay.isExpress(i) && lay.guard {
		g.guard.Begin(l, since)
	}
	return nil
}

// renewByResume renews express link l to p, which still works, by
// resuming it on a fresh connection (HELLO renew flag): the new socket
// starts with a fresh congestion window, and whatever the old one still
// held unacknowledged, often the very messages its losses delayed, is
// written again on the new one from the byte the peer has. The new
// connection is set up (TCP and TLS) before the old one stops, so the link
// is down for one HELLO exchange. Without resume, a link is renewed by
// retiring it (relay.Trunk.Add), and bytes stuck in a retiring link's
// socket cost its streams when that socket breaks. It returns the link
// that then serves as link i, as resumeLoop does.
func (g *Gateway) renewByResume(p *peer, i int, l *relay.Link, log *slog.Logger) *relay.Link {
	c, since, err := g.dialSecure(p)
	if err != nil {
		log.Warn("express link renewal failed; keeping the old connection", "err", err)
		return l
	}
	if err := l.Pause(); err != nil {
		c.Close()
		return l // failed meanwhile: the dialLoop sees it done
	}
	return g.resumeLoop(p, i, l, log, c, since)
}

// resumeLoop reconnects link i to p, which broke, and resumes it on the
// new connection, retrying with a short backoff until it resumes or fails
// (down longer than --wan-resume-within). It returns the link that then
// serves as link i: l, or a new link when the peer had no state left for
// l (it restarted), or nil when l failed.
//
// A renewal (renewByResume) passes the connection it has set up as first,
// and its HELLOs carry the renew flag: the peer ends its old connection as
// planned. A renewal may resume what the dialer paused only.
func (g *Gateway) resumeLoop(p *peer, i int, l *relay.Link, log *slog.Logger, first net.Conn, firstSince time.Time) *relay.Link {
	renew := first != nil
	backoff := time.Duration(0)
	refused := false
	for {
		if first == nil {
			select {
			case <-l.Done():
				return nil // the dialLoop reconnects afresh
			case <-g.ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(max(2*backoff, 20*time.Millisecond), time.Second)
		}
		h, err := l.ResumeHello(g.hello(p, i))
		if err != nil {
			if first != nil {
				first.Close()
			}
			return nil // failed meanwhile
		}
		h.Renew = renew
		var c net.Conn
		var ph header.Hello
		var lay *layout
		var since time.Time
		if first != nil {
			c, since, first = first, firstSince, nil
			if ph, lay, err = g.helloOn(c, p, h); err != nil {
				c.Close()
			}
		} else {
			c, ph, lay, since, err = g.dialHello(p, h)
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			// The peer's host answers and no gateway listens: it has
			// exited, and the link's state with it. Only when a second
			// dial confirms it: one refusal can be a passing state of a
			// busy peer's listener, and a wrong verdict costs the streams.
			if refused {
				log.Warn("WAN link cannot resume: the peer gateway is not running; its streams are reset", "addr", p.wan.String())
				l.Close()
				return nil
			}
			refused = true
			log.Debug("WAN link resume: refused once; dialing again to confirm", "addr", p.wan.String())
			continue
		}
		refused = false
		if err != nil {
			log.Debug("WAN link resume: dial failed", "err", err, "retry_in", backoff)
			g.m.wanDialFailures.Inc()
			continue
		}
		if !ph.Resume || ph.Session != l.Session() {
			// The peer no longer knows the link: its streams are lost
			// there. Fail it here too and make the connection a new link.
			log.Warn("WAN link could not resume: the peer gateway has no state for it (restarted?); its streams are reset")
			l.Close()
			done, err := g.adopt(p, lay, i)
			if err != nil {
				// The restarted peer agrees on another layout: the
				// dialLoop adopts it once the pair's old links are gone.
				c.Close()
				return nil
			}
			defer done()
			return g.addLink(p, i, c, ph, since, h.Session)
		}
		if err := g.resumed(p, i, l, c, ph, since); err != nil {
			c.Close()
			log.Warn("WAN link resume failed", "err", err)
			continue
		}
		if renew {
			p.renewed.Add(1)
			log.Debug("express link renewed", "remote", c.RemoteAddr().String())
		}
		return l
	}
}
