package gateway

// Where the gateway applies package tuning's WAN policies to a link (the
// policies themselves are tuning's). A WAN link meets them as it is
//
//  1. created: wanCreate, the socket options it is dialed or accepted with;
//  2. joined to its trunk (addLink, resumed in wan.go): tuneLink, the
//     options that differ between the express and the bulk links, and the
//     PROBE_RTT guard's clock (tuning.ProbeGuard.Begin);
//  3. new: primeLink, PAD filler until BBR has measured the path;
//  4. sampled (sampleWAN, tcpevents.go): stepExpress, the express link's
//     renewals and holds (tuning.ExpressControl, through the relay's hook).

import (
	"net"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tuning"
)

// wanCreate is the options WAN sockets are created with. With an express
// congestion control they are created with it and the bulk links switch to
// the WAN one after the handshake: a socket once run by BBR keeps the
// kernel's pacing on whatever it switches to (sk_pacing_status), which
// spreads every small burst over most of an RTT, so the express link must
// never have been BBR.
func (g *Gateway) wanCreate() tuning.SockOpts {
	o := g.cfg.WAN
	if g.cfg.ExpressCC != "" && o.CC != "" {
		o.CC = g.cfg.ExpressCC
	}
	return o
}

// tuneLink sets the socket options of link i that differ from the WAN
// sockets' own. The express link is exempt from --wan-pace (it carries
// only messages, and they must not wait for a pacing slot) and may have
// its own congestion control.
func (g *Gateway) tuneLink(p *peer, i int, c net.Conn) {
	x := p.isExpress(i)
	var err error
	switch {
	case x && g.cfg.WAN.MaxPacingRate > 0:
		err = tuning.TuneLink(relay.TCPOf(c), true, "")
	case !x && g.cfg.ExpressCC != "" && g.cfg.ExpressCC != g.cfg.WAN.CC:
		err = tuning.TuneLink(relay.TCPOf(c), false, g.cfg.WAN.CC)
	}
	if err != nil {
		g.log.Warn("WAN link: socket options not set", "peer", p.name, "link", i, "express", x, "err", err)
	}
}

// primeLink primes link l (tuning.Prime), after any other link of p's, and
// logs what it did.
func (g *Gateway) primeLink(p *peer, i int, express bool, l *relay.Link) {
	p.primeMu.Lock()
	r := tuning.Prime(l, express, tuning.PrimeMaxTime)
	p.primeMu.Unlock()
	g.peersMu.Lock()
	g.priming--
	all := g.allUpLocked()
	g.peersMu.Unlock()
	if all {
		g.setReady()
	}
	log := g.log.With("peer", p.name, "link", i, "express", express)
	switch {
	case r.Skipped != "":
		log.Debug("WAN link not primed", "why", r.Skipped)
	case r.Err != nil:
		log.Debug("WAN link priming ended with the link", "err", r.Err, "pad_bytes", r.Bytes)
	case r.Took >= tuning.PrimeMaxTime:
		log.Warn("WAN link priming gave up after its time limit", "bbr_mode", r.Mode.String(), "estimate_settled", r.Primed,
			"pad_bytes", r.Bytes, "took", r.Took.Round(time.Millisecond), "bbr_bw_bps", 8*r.BW)
	default:
		// Not settled: the filler limit, reached first on a path of tiny
		// BDP, where the estimate is far above any message's needs.
		log.Info("WAN link primed", "bbr_mode", r.Mode.String(), "estimate_settled", r.Primed,
			"pad_bytes", r.Bytes, "took", r.Took.Round(time.Millisecond), "bbr_bw_bps", 8*r.BW)
	}
}

// stepExpress runs each peer's express controller (tuning.ExpressControl,
// relay.Config.ExpressControl) on the TCP_INFO samples the WAN sampler has
// just taken (sampleWAN), and counts and logs the holds it starts.
func (g *Gateway) stepExpress() {
	if !g.anyLayout(func(l *layout) bool { return l.rcfg.ExpressControl != nil }) {
		return
	}
	now := time.Now()
	for _, p := range g.peerList() {
		if d := p.trunk.StepExpress(now, g.m.ev.last); d.Hold > 0 {
			p.yields.Add(1)
			g.log.Info("messages take the bulk links: another flow keeps the WAN queue full", append([]any{"peer", p.name}, d.Log...)...)
		}
	}
}
