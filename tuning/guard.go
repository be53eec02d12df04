package tuning

import (
	"context"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// PROBE_RTT skipping.
//
// A BBR socket that has sent without pause for 10 s with no RTT sample at or
// below its min_rtt enters PROBE_RTT on its next ACK: cwnd 4 for at least
// 200 ms, about 2.5 % of a bulk link's rate (bench/figures/bulk). A bulk link that
// keeps the bottleneck queue full never sees such a sample. BBR skips the
// dip when the first ACK after the filter expires ends a restart from idle
// (tcp_bbr.c, bbr_update_min_rtt: idle_restart): it restamps min_rtt from
// that ACK instead.
//
// So the guard holds a busy BBR bulk link (relay.Link.Hold) just long enough
// for its socket to have nothing in flight when the filter expires, and
// resumes so that the first new ACK arrives after the expiry. The bottleneck
// then idles for a few tens of milliseconds instead of 200+. The kernel does
// not export the filter's stamp; tcpinfo.MinRTTStamp places it between two
// samples, so the guard samples every guardEvery.

const (
	// guardEvery is the guard's sampling period: the stamp is known to
	// within one period, and the hold covers that uncertainty.
	guardEvery = 5 * time.Millisecond
	// guardMaxSpread: a stamp known less precisely than this is not acted
	// on. The hold covers the uncertainty, less a min RTT, and a dip costs
	// 200+ ms: up to 100 ms a hold is still much the cheaper. A new link's
	// stamp is known to within its handshake (begin).
	guardMaxSpread = 100 * time.Millisecond
	// guardMaxHold: a hold that would last longer costs more than the
	// dip it avoids (200 ms at 4 segments per RTT), so the guard lets the
	// dip happen. It also bounds a hold planned from a bandwidth estimate
	// of a link that has only sent bursts, which can be far too low.
	guardMaxHold = 200 * time.Millisecond
	// guardMargin separates the first new ACK from the latest expiry.
	guardMargin = 2 * time.Millisecond
	// probeRTTCwnd is PROBE_RTT's cwnd (bbr_cwnd_min_target): a link with
	// no more in flight loses nothing to a dip and is not held.
	probeRTTCwnd = 4
)

// guardLink is the guard's state for one WAN link.
type guardLink struct {
	cc     string // the socket's congestion control ("" until read)
	listed bool   // seen among the gateway's links (begin comes first)
	// quiet: the last sample had nothing in flight, and frames is what the
	// link had sent then; until it sends more, BBR's state cannot change.
	quiet  bool
	frames uint64
	last   tcpinfo.BBR // the last sample, still current while quiet

	stamp   tcpinfo.MinRTTStamp
	holding bool
	from    time.Time // earliest expiry covered by the current or last hold
	end     time.Time // when the current hold ends
	start   time.Time // when it began
	// verifyBy: after a hold, a restamp (or a PROBE_RTT) is expected
	// before this time; zero when nothing is being verified.
	verifyBy time.Time

	// Counters, read by metrics; like the rest, under ProbeGuard.mu.
	holds, skips uint64
	held         time.Duration
}

// guardWatch is the guard's slot among a link's send watches
// (relay.Link.WatchSend); the gateway's WAN sampler has the other.
const guardWatch = 0

// guardIdleEvery is the sampling period while no bulk BBR link is busy: a
// quiet link's BBR state cannot change until it sends, and its next frame
// wakes the guard (relay.Link.WatchSend), so the slow period only tracks
// express traffic (guardMsgWindow) and links that went away.
const guardIdleEvery = 250 * time.Millisecond

// ProbeGuard is the PROBE_RTT guard of one gateway: Begin registers each new
// bulk link, Run samples them all until its context ends.
type ProbeGuard struct {
	mu        sync.Mutex
	idleEvery time.Duration // guardIdleEvery unless a test set it
	links     map[*relay.Link]*guardLink
	live      LinkSet
	// msgs: when each peer site's express link last sent (the bytes it had
	// sent then). While messages cross, queue control caps the bulk links
	// and a bulk link's bytes are MPI messages' tails: no holds then.
	msgs map[uint8]msgSeen
	raw  tcpinfo.Raw
	in   tcpinfo.Info
	bbr  tcpinfo.BBR
	// kick wakes the sampling loop: a watched quiet link sent a frame, or
	// a new link began.
	kick chan struct{}
	// ticks counts samplings, busy those that found a link busy (tests).
	ticks, busy uint64
}

// NewProbeGuard returns a guard with no links.
func NewProbeGuard() *ProbeGuard {
	return &ProbeGuard{idleEvery: guardIdleEvery, kick: make(chan struct{}, 1)}
}

// SetIdleEvery changes the sampling period while every link is quiet
// (tests: only a link's next frame can then wake the guard).
func (pg *ProbeGuard) SetIdleEvery(d time.Duration) {
	pg.mu.Lock()
	pg.idleEvery = d
	pg.mu.Unlock()
}

// Samples returns how many times the guard sampled the links, and how many
// of those found a bulk link busy.
func (pg *ProbeGuard) Samples() (ticks, busy uint64) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.ticks, pg.busy
}

type msgSeen struct {
	sent uint64
	at   time.Time
}

// guardMsgWindow is how long after the last message a site pair's bulk
// links count as carrying messages (relay's queue control uses 5 s too).
const guardMsgWindow = 5 * time.Second

// Run runs the guard on every bulk link links returns until ctx ends. It
// samples every guardEvery while a bulk BBR link is busy. Once all are
// quiet it waits for the next frame one of them sends, checking every
// idleEvery: an idle gateway, or one that only carries messages on the
// express link, was woken 200 times a second by the guard alone.
func (pg *ProbeGuard) Run(ctx context.Context, links func() []*relay.Link) {
	t := time.NewTimer(guardEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-pg.kick:
		}
		ls := links()
		busy := pg.tick(ls)
		if !busy {
			for _, l := range ls {
				if !l.Express() {
					l.WatchSend(guardWatch, pg.kick)
				}
			}
			// A frame sent between the sample and the watch.
			busy = pg.tick(ls)
		}
		if busy {
			t.Reset(guardEvery)
		} else {
			pg.mu.Lock()
			idle := pg.idleEvery
			pg.mu.Unlock()
			t.Reset(relay.OnGrid(idle))
		}
	}
}

// tick samples links; busy: some bulk BBR link needs sampling every
// guardEvery (it has bytes in flight, or a hold to end or verify).
func (pg *ProbeGuard) tick(links []*relay.Link) (busy bool) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.links == nil {
		pg.links = map[*relay.Link]*guardLink{}
	}
	pg.live.Reset(links)
	for l, gl := range pg.links {
		if gl.listed && !pg.live.Has(l) {
			delete(pg.links, l)
		}
	}
	if pg.msgs == nil {
		pg.msgs = map[uint8]msgSeen{}
	}
	now := time.Now()
	for _, l := range links {
		if l.Express() {
			// Its own sending is app-limited messages (idle restarts are
			// its normal state); note when it last carried any.
			id := l.Peer().SiteID
			if n := l.Stats.BytesSent.Load(); n != pg.msgs[id].sent {
				pg.msgs[id] = msgSeen{n, now}
			}
		}
	}
	for _, l := range links {
		if l.Express() {
			continue
		}
		gl := pg.links[l]
		if gl == nil {
			gl = &guardLink{}
			pg.links[l] = gl
		}
		gl.listed = true
		if gl.cc != "" && gl.cc != "bbr" {
			continue
		}
		frames := l.Stats.FramesSent.Load()
		if gl.quiet && frames == gl.frames && !gl.holding && gl.verifyBy.IsZero() {
			gl.stamp.Observe(time.Now(), &gl.last) // unchanged until now
			continue
		}
		if have, err := ReadLinkSocket(l, &gl.cc, &pg.raw, &pg.in, &pg.bbr); err != nil || !have {
			continue
		}
		gl.quiet, gl.frames, gl.last = pg.in.Unacked == 0, frames, pg.bbr
		at := time.Now()
		m := pg.msgs[l.Peer().SiteID]
		gl.step(l, at, &pg.in, &pg.bbr, !m.at.IsZero() && at.Sub(m.at) < guardMsgWindow)
		busy = busy || !gl.quiet || gl.holding || !gl.verifyBy.IsZero()
	}
	pg.ticks++
	if busy {
		pg.busy++
	}
	return busy
}

// step takes one sample (in, b) of link l read at now; msgs: messages
// cross the site pair (no new holds).
func (gl *guardLink) step(l holder, now time.Time, in *tcpinfo.Info, b *tcpinfo.BBR, msgs bool) {
	gl.stamp.Observe(now, b)
	if gl.holding {
		if now.Before(gl.end) {
			// Still draining close to the end: stretch the hold, or the
			// resumed bytes would join a flight whose ACKs cross the expiry.
			if gl.end.Sub(now) <= guardEvery && in.Unacked > 0 && now.Before(gl.from) && gl.end.Sub(gl.start) < guardMaxHold {
				gl.end = gl.end.Add(guardEvery)
				gl.held += guardEvery
				l.Hold(gl.end)
			}
			return
		}
		gl.holding = false
		gl.verifyBy = now.Add(time.Second)
		return
	}
	from, to, known := gl.stamp.Expiry()
	if !gl.verifyBy.IsZero() {
		switch {
		case !known && b.Mode() == tcpinfo.BBRProbeRTT:
			gl.verifyBy = time.Time{} // dipped anyway (counted by wanEvents)
		case known && from.After(gl.from):
			gl.skips++ // BBR restamped min_rtt from the restart
			gl.verifyBy = time.Time{}
		case now.After(gl.verifyBy):
			// Neither: the link stayed idle (the next burst restamps, in
			// sight), or an equal sample restamped it unseen.
			gl.stamp.Forget()
			gl.verifyBy = time.Time{}
		}
		return
	}
	if !known {
		return
	}
	if now.After(to.Add(time.Second)) {
		gl.stamp.Forget() // expired unseen: restamped by an equal sample, or idle
		return
	}
	if msgs || !now.Before(from) || to.Sub(from) > guardMaxSpread || b.Bandwidth == 0 || in.Unacked <= probeRTTCwnd {
		return
	}
	// Time for what is queued in the socket and in flight to leave the
	// bottleneck, plus the last ACK's way back.
	queued := float64(in.Unacked)*float64(in.SndMSS) + float64(in.NotsentBytes)
	drain := time.Duration(1.1*queued/float64(b.Bandwidth)*float64(time.Second)) + b.MinRTT/2
	if now.Add(drain + 2*guardEvery).Before(from) {
		return
	}
	// Resume so that the first new ACK, a min RTT later, comes after the
	// latest expiry; but not before the flight has drained.
	end := to.Add(guardMargin - b.MinRTT)
	if d := now.Add(drain + guardEvery); end.Before(d) {
		end = d
	}
	if end.Sub(now) > guardMaxHold {
		return
	}
	gl.holding, gl.from, gl.end, gl.start = true, from, end, now
	gl.holds++
	gl.held += end.Sub(now)
	l.Hold(end)
}

// Begin registers a new bulk link l whose socket was established after
// since: BBR stamped its min_rtt then.
func (pg *ProbeGuard) Begin(l *relay.Link, since time.Time) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if pg.links == nil {
		pg.links = map[*relay.Link]*guardLink{}
	}
	gl := &guardLink{}
	gl.stamp.Begin(since)
	pg.links[l] = gl
	select {
	case pg.kick <- struct{}{}:
	default:
	}
}

// holder is what the guard needs of a link (a test fakes it).
type holder interface{ Hold(until time.Time) }

// Counters returns the guard's counters for l.
func (pg *ProbeGuard) Counters(l *relay.Link) (holds, skips uint64, held time.Duration, ok bool) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	gl := pg.links[l]
	if gl == nil || gl.cc != "bbr" {
		return 0, 0, 0, false
	}
	return gl.holds, gl.skips, gl.held, true
}
