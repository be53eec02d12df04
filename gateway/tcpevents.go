package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
	"github.com/mpi5k/mpi5k/tuning"
)

// wanSampleEvery is how often the WAN sockets' TCP_INFO is sampled for
// event derivation. A scrape alone (every 15 s or so) cannot tell a fast
// retransmit from an RTO or see a restart after idle: those need samples
// closer together than the RTO (>= 200 ms).
const wanSampleEvery = 100 * time.Millisecond

// wanEvents keeps one tcpinfo.Tracker per WAN link: fast vs RTO
// retransmits, RTOs and idle restarts of the aggregated WAN connections,
// the same counters the shim records for application sockets in trace
// mode (docs/tracing.md), exported by metrics.
type wanEvents struct {
	mu   sync.Mutex
	t    map[*relay.Link]*linkTrack
	live tuning.LinkSet
	raw  tcpinfo.Raw
	in   tcpinfo.Info
	bbr  tcpinfo.BBR
	// wakes counts the sampler's rounds, and idle says it waits
	// wanSampleIdle (tests).
	wakes atomic.Uint64
	idle  atomic.Bool
}

// wanSampleIdle is the sampling period once wanIdleAfter samples in a row
// found no link changed: a link that sends nothing has no event to tell
// apart, and on an idle gateway each wake-up costs more than its sample
// (a hub with 254 idle peers spent most of its idle CPU on timers). The
// first DATA or PAD frame any link sends wakes the sampler at once
// (relay.Link.WatchSend), so a burst after a pause is sampled from its
// start.
const (
	wanSampleIdle = time.Second
	wanIdleAfter  = 10
)

// samplerWatch is the WAN sampler's slot among a link's send watches; the
// PROBE_RTT guard (package tuning) has the other.
const samplerWatch = 1

// sampleWAN samples every WAN link until the gateway stops, then marks
// g.wg done: every wanSampleEvery, on the process's timer grid
// (relay.OnGrid), or every wanSampleIdle while nothing changes.
func (g *Gateway) sampleWAN() {
	defer g.wg.Done()
	wake := make(chan struct{}, 1)
	tm := time.NewTimer(relay.OnGrid(wanSampleEvery))
	defer tm.Stop()
	still := 0 // samples in a row that found no link changed
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-tm.C:
		case <-wake:
		}
		g.m.ev.wakes.Add(1)
		links := g.allLinks()
		if g.m.ev.sample(links) > 0 {
			still = 0
		} else {
			still++
		}
		g.stepExpress()
		d := wanSampleEvery
		if still >= wanIdleAfter {
			for _, l := range links {
				l.WatchSend(samplerWatch, wake)
			}
			// A frame sent between the sample and the watches.
			if g.m.ev.sample(links) > 0 {
				still = 0
			} else {
				d = wanSampleIdle
			}
		}
		g.m.ev.idle.Store(d == wanSampleIdle)
		tm.Reset(relay.OnGrid(d))
	}
}

// linkTrack is one link's event tracker and the frames the link had carried
// (both ways) at its last sample.
type linkTrack struct {
	tcpinfo.Tracker
	frames uint64
	conn   net.Conn // the socket sampled: a resumed link has a new one
}

// sample samples links and returns how many it read: a link that has
// carried no frame since its last sample, with nothing in flight then, is
// skipped.
func (w *wanEvents) sample(links []*relay.Link) (n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t == nil {
		w.t = map[*relay.Link]*linkTrack{}
	}
	// Forget links that were replaced; their counters restart with the
	// new link (a Prometheus counter reset).
	w.live.Reset(links)
	for l := range w.t {
		if !w.live.Has(l) {
			delete(w.t, l)
		}
	}
	for _, l := range links {
		tr := w.t[l]
		conn := l.Conn()
		if tr != nil && tr.conn != conn {
			tr = nil // resumed: a new socket's counters start again
		}
		fresh := tr == nil
		if fresh {
			tr = &linkTrack{conn: conn}
		}
		// A link with nothing in flight at the last sample that has
		// carried no frame since cannot have changed: its sample would be
		// a syscall for nothing (most of an idle hub's sampling). Its
		// keepalives bring it back, about every 3 s while idle (relay/keep.go).
		frames := l.Stats.FramesSent.Load() + l.Stats.FramesRecv.Load()
		if in, _, ok := tr.Last(); ok && in.Unacked == 0 && frames == tr.frames {
			continue
		}
		// BBR's PROBE_RTT dips (cwnd 4 for >= 200 ms every 10 s of
		// continuous sending) cost a bulk link about 2.5 % of its rate;
		// the counter tells such a run from a loss-limited one.
		haveBBR, err := tuning.ReadLinkSocket(l, &tr.CongestionControl, &w.raw, &w.in, &w.bbr)
		if err != nil {
			continue
		}
		if fresh {
			w.t[l] = tr
		}
		n++
		tr.frames = frames
		now := time.Now()
		tr.Update(now, &w.in, nil)
		if haveBBR {
			tr.UpdateBBR(now, &w.bbr)
		}
	}
	return n
}

// last returns the latest TCP_INFO sample of l, if it has one.
func (w *wanEvents) last(l *relay.Link) (tcpinfo.Info, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tr := w.t[l]; tr != nil {
		in, _, ok := tr.Last()
		return in, ok
	}
	return tcpinfo.Info{}, false
}

// counters returns what was derived for l so far, and its last BBR
// sample (bbr false unless the link runs BBR).
func (w *wanEvents) counters(l *relay.Link) (c tcpinfo.Counters, b tcpinfo.BBR, ok, bbr bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tr := w.t[l]
	if tr == nil {
		return c, b, false, false
	}
	b, bbr = tr.LastBBR()
	return tr.C, b, true, bbr
}
