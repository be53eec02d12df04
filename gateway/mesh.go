package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

func (g *Gateway) features() uint8 {
	f := header.FeatureTrunk | header.FeatureClamp | header.FeaturePad | header.FeatureQuiet
	if _, ok := g.lan.(*MXTransport); ok {
		f |= header.FeatureNodeResume
	}
	if g.cfg.ResumeWithin > 0 {
		f |= header.FeatureResume
	}
	if g.cfg.Express {
		f |= header.FeatureExpress
		if g.cfg.Renew {
			f |= header.FeatureRenew
		}
	}
	return f
}

// hello is the HELLO of a new link i; a resuming link gets a fresh
// session (never 0).
func (g *Gateway) hello(i int) header.Hello {
	h := g.rcfg.Hello(g.site.ID, g.site.Name, uint8(i), uint8(g.numLinks()))
	h.Features = g.features()
	h.Gateway = uint8(g.gw)
	if h.Features&header.FeatureResume != 0 {
		h.Session = rand.Uint64() | 1
	}
	return h
}

// addLink joins conn to p's trunk as link i; local is the session our
// HELLO gave it (0: none, the link does not resume).
//
// since is a time before the TCP connection was established: the PROBE_RTT
// guard starts its BBR min_rtt clock there.
func (g *Gateway) addLink(p *peer, i int, c net.Conn, ph header.Hello, since time.Time, local uint64) *relay.Link {
	x := g.isExpress(i)
	g.tuneLink(p, i, c)
	rcfg := g.rcfg
	var l *relay.Link
	if local != 0 && ph.Session != 0 {
		l = p.trunk.AddResumable(c, rcfg, ph, i, x, local)
	} else {
		l = p.trunk.Add(c, rcfg, ph, i, x)
	}
	if !x && g.cfg.ProbeRTTGuard {
		g.guard.Begin(l, since) // before setLink publishes l to the guard
	}
	g.setLink(p, i, l, g.cfg.Prime)
	if g.cfg.Prime {
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
	if !g.isExpress(i) && g.cfg.ProbeRTTGuard {
		g.guard.Begin(l, since)
	}
	return nil
}

// dialLoop keeps link i to p up: dial, handshake, run until it dies,
// reconnect with capped exponential backoff plus jitter.
func (g *Gateway) dialLoop(p *peer, i int) {
	defer g.wg.Done()
	backoff := 50 * time.Millisecond
	log := g.log.With("peer", p.name, "link", i)
	for g.ctx.Err() == nil && !p.removed.Load() {
		l, err := g.dialOnce(p, i)
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
		if g.isExpress(i) {
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
				// At most one renewal per renewGap, whoever asks; a request
				// that comes sooner waits for the gap to pass.
				if g.draining.Load() || p.removed.Load() || later != nil {
					continue
				}
				if wait := renewGap - time.Since(lastRenew); wait > 0 {
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

// expressCold: a socket with this cwnd, ssthresh and MSS (TCP_INFO) has
// left slow start below the segments of one message of max bytes, and its
// window is below them too. A socket still in its first slow start
// (ssthresh infinite) is never cold: it grows to twice the largest burst.
func expressCold(cwnd, ssthresh, mss uint32, max int) bool {
	if mss == 0 {
		return false
	}
	need := uint32((max + int(mss) - 1) / int(mss))
	return ssthresh < need && cwnd < need
}

func kickRenew(p *peer) {
	select {
	case p.renew <- struct{}{}:
	default:
	}
}

// renewGap is the shortest time between two renewals of a site pair's
// express link, which bounds the handshakes a lossy WAN can cost.
const renewGap = time.Second

// checkExpress renews the express links whose congestion window is cold:
// loss recovery has set the slow-start threshold below one message of
// ExpressMax bytes and the window is still below it. Messages are
// app-limited, so such a window hardly grows again, and every message
// larger than it costs extra round trips; a fresh connection starts in
// slow start and grows to twice the largest message within a few. Each
// side judges the window it sends with: the dialer dials, the acceptor
// asks it to with RENEW. A cold window that comes with another flow's
// queue also holds the express link aside (yieldExpress). Called at each
// WAN sample (sampleWAN), right after the sampler has read every link's
// TCP_INFO, whose samples it uses.
func (g *Gateway) checkExpress() {
	if !g.cfg.Express || !g.cfg.Renew && !g.cfg.ExpressYield {
		return
	}
	g.peersMu.Lock()
	type cand struct {
		p *peer
		l *relay.Link
	}
	var cs []cand
	for _, p := range g.peers {
		if l := p.links[g.cfg.WANConns]; l != nil && !l.Retiring() {
			cs = append(cs, cand{p, l})
		}
	}
	g.peersMu.Unlock()
	now := time.Now()
	for _, c := range cs {
		in, ok := g.m.ev.last(c.l)
		if !ok || !expressCold(in.SndCwnd, in.SndSsthresh, in.SndMSS, g.cfg.ExpressMax) {
			continue
		}
		if g.cfg.ExpressYield {
			g.yieldExpress(c.p, in, now)
		}
		if !g.cfg.Renew {
			continue
		}
		if c.p.dialer {
			kickRenew(c.p)
		} else {
			c.l.RequestRenew(renewGap)
		}
	}
}

// How long a hold of the express link lasts (yieldExpress): the first
// one, and at most, doubling while holds follow each other.
const (
	yieldFirst = 10 * time.Second
	yieldMax   = time.Minute
)

// yieldQueue is the standing queue, above a path's min RTT of base, that
// only another flow keeps (yieldExpress): a quarter of the path's round
// trip and at least 4 ms, above what the messages of one exchange and a
// bulk link under queue control (1 ms by default) add.
func yieldQueue(base time.Duration) time.Duration { return max(base/4, 4*time.Millisecond) }

// yieldExpress holds p's express link aside (relay.Trunk.HoldExpress)
// when its cold window x (checkExpress) comes with another flow's queue:
// x's min RTT stands yieldQueue above the path's (foreignQueue), which
// the first cold window of an express link that started before that flow
// does not show, and the one after its renewal does. Against such a flow
// a message waits in its queue on any link, and there the CUBIC express
// link, renewed as losses cut it, starts again from 10 segments about
// once a second, while the primed BBR bulk link keeps its window
// (bench/figures/computework: LU, MG and CG at 0.94-1.04 of direct
// without the express link, 1.23-2.23 with it). The hold doubles from
// yieldFirst to yieldMax while holds follow each other, and starts over
// at yieldFirst after one hold's worth of time with none; at its end the
// express link is tried again. It runs only on a cold window, so the
// sampler reads p's bulk links here rather than at every sample.
func (g *Gateway) yieldExpress(p *peer, x tcpinfo.Info, now time.Time) {
	if p.trunk.ExpressHeld(now) {
		return
	}
	g.peersMu.Lock()
	bulk := slices.Clone(p.links[:g.cfg.WANConns])
	g.peersMu.Unlock()
	var ins []tcpinfo.Info
	for _, l := range bulk {
		if l == nil {
			continue
		}
		if in, ok := g.m.ev.last(l); ok {
			ins = append(ins, in)
		}
	}
	q, base, ok := foreignQueue(x, ins)
	if !ok {
		return
	}
	hold := p.nextYield(now)
	p.trunk.HoldExpress(hold)
	p.yields.Add(1)
	g.log.Info("messages take the bulk links: another flow keeps the WAN queue full", "peer", p.name,
		"queue", q.Round(100*time.Microsecond).String(), "min_rtt", base.Round(100*time.Microsecond).String(),
		"express_cwnd", x.SndCwnd, "for", hold.String())
}

// foreignQueue reports whether the express link's TCP_INFO x shows
// another flow's queue (yieldExpress), given the bulk links' bulk. The
// queue q is x's min RTT over the path's, base: what stood under every
// round trip x measured in its life. The long-lived bulk links know the
// path's min RTT; an express link renewed under another flow's queue
// never sees it. A queue of our own comes and goes with our bursts (the
// first segments after a pause cross an empty one), so it does not stand
// under all of a link's samples, unless our own bulk kept it full all
// along: so none may wait in a bulk link's socket, and the part of q that
// the bulk links' bytes in flight can account for does not count (by
// Little's law they take inflight / rate to cross, rate being the bulk
// links' latest delivery rates summed, which read low at a burst's tail
// and leave more to our own bulk).
func foreignQueue(x tcpinfo.Info, bulk []tcpinfo.Info) (q, base time.Duration, ok bool) {
	var inflight, rate float64 // bytes, bytes/s
	for _, in := range bulk {
		if in.NotsentBytes > 0 {
			return 0, 0, false // our own bulk waits: it may be what queues
		}
		if in.MinRTT > 0 && (base == 0 || in.MinRTT < base) {
			base = in.MinRTT
		}
		inflight += float64(in.Unacked) * float64(in.SndMSS)
		rate += float64(in.DeliveryRate)
	}
	if base <= 0 || x.MinRTT <= 0 {
		return 0, base, false
	}
	q = x.MinRTT - base
	var own time.Duration
	if inflight > 0 {
		if rate <= 0 {
			return q, base, false
		}
		own = max(time.Duration(inflight/rate*float64(time.Second))-base, 0)
	}
	return q, base, q-own >= yieldQueue(base)
}

// nextYield returns how long the hold that starts at now lasts: double
// the last one while holds follow each other, up to yieldMax; yieldFirst
// after a gap as long as the next would have been.
func (p *peer) nextYield(now time.Time) time.Duration {
	hold := p.yieldNext
	if hold == 0 || now.Sub(p.yieldEnd) > hold {
		hold = yieldFirst
	}
	p.yieldEnd, p.yieldNext = now.Add(hold), min(2*hold, yieldMax)
	return hold
}

func (g *Gateway) dialOnce(p *peer, i int) (*relay.Link, error) {
	h := g.hello(i)
	c, ph, since, err := g.dialHello(p, h)
	if err != nil {
		return nil, err
	}
	return g.addLink(p, i, c, ph, since, h.Session), nil
}

// dialHello connects to p's gateway, runs TLS over the connection when
// the map has keys, and exchanges HELLOs, ours h; since is a time before
// the connection was established.
func (g *Gateway) dialHello(p *peer, h header.Hello) (net.Conn, header.Hello, time.Time, error) {
	c, since, err := g.dialSecure(p)
	if err != nil {
		return nil, header.Hello{}, since, err
	}
	ph, err := g.helloOn(c, p, h)
	if err != nil {
		c.Close()
		return nil, ph, since, err
	}
	return c, ph, since, nil
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

// helloOn exchanges HELLOs, ours h, on c, a connection to p's gateway.
func (g *Gateway) helloOn(c net.Conn, p *peer, h header.Hello) (header.Hello, error) {
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	ph, err := relay.Handshake(ctx, c, h)
	if err == nil {
		// The acceptor's index is informational: only the dialer's is
		// meaningful.
		err = g.checkHello(ph, p, -1)
	}
	return ph, err
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
		h, err := l.ResumeHello(g.hello(i))
		if err != nil {
			if first != nil {
				first.Close()
			}
			return nil // failed meanwhile
		}
		h.Renew = renew
		var c net.Conn
		var ph header.Hello
		var since time.Time
		if first != nil {
			c, since, first = first, firstSince, nil
			if ph, err = g.helloOn(c, p, h); err != nil {
				c.Close()
			}
		} else {
			c, ph, since, err = g.dialHello(p, h)
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

func (g *Gateway) checkHello(h header.Hello, p *peer, i int) error {
	switch {
	case h.SiteID != p.site.ID:
		return fmt.Errorf("peer says it is site id %d, want %d", h.SiteID, p.site.ID)
	case h.Name != p.site.Name:
		return fmt.Errorf("peer says it is site %q, want %q", h.Name, p.site.Name)
	case int(h.Gateway) != p.gw:
		return fmt.Errorf("peer says it is gateway %d of site %s, want %d (%v)", h.Gateway, p.site.Name, p.gw, p.wan)
	case int(h.LinkCount) != g.numLinks() || h.Features&^header.FeatureNodeResume != g.features()&^header.FeatureNodeResume:
		// NODE_RESUME says what the sender's LAN is, which differs
		// between sites.
		return fmt.Errorf("peer has %d links per site pair (features %#x), we have %d (features %#x): "+
			"run the same mpi5k build with the same --wan-conns, --wan-express, --wan-express-renew and --wan-resume-within on every gateway",
			h.LinkCount, h.Features, g.numLinks(), g.features())
	case i >= 0 && int(h.LinkIndex) != i:
		return fmt.Errorf("peer link index %d, want %d", h.LinkIndex, i)
	}
	return nil
}

// ---- LAN side ----
