package tuning

import (
	"slices"
	"time"

	"github.com/mpi5k/mpi5k/relay"
)

// Queue control keeps the WAN bottleneck's queue near its target
// while a bulk link saturates it, so the small messages of other streams
// (on the express link, through the same bottleneck) do not wait behind a
// full drop-tail queue. Unpaced, a bulk TCP flow fills that queue: BBR's
// 2 x BDP congestion window and CUBIC's loss-driven growth both do.
//
// The sending side measures and the receiving side's kernel enforces. Every
// few milliseconds the sender reads its link socket's TCP_INFO: the
// standing queue is the least of srtt - min_rtt over the last round trip,
// and the delivery rate is the bytes acknowledged over that round trip. It
// then asks the peer (CLAMP frame) to cap its receive window at
// rate x (min_rtt + target): in flight never exceeds one bandwidth-delay
// product plus the target's worth of queue. While the bottleneck has a
// queue, the delivery rate is the bottleneck rate, so the cap holds the
// queue at the target without knowing the WAN's rate. While it has none,
// the cap is at least the best rate of the last 2 busy seconds times
// (min_rtt + target): a cap that fell below the path's rate is restored at
// once, and the target's headroom lets a faster path show itself (the cap
// then follows by target/min_rtt per round trip).
//
// Only a transfer that saturates the path is capped, not a burst: the
// cap is set once the link has had bytes waiting for queueSaturated, with
// no pause as long as queueBurstGap (a sender that falls behind for a
// moment is still the same transfer), and dropped once it has had none
// for queueBurstGap. An MPI code's exchange phases are bursts of a few
// hundred milliseconds between computations; a burst's first round trips deliver at a
// fraction of the path's rate (the window opens as ACKs return), so a cap
// set from them came in far below the bandwidth-delay product, grew by the
// target's headroom per round trip (5 % at 20 ms), and, kept over the
// computation, started the next burst under it. With NAS SP's volumes
// the cap sat at 16-180 KB against a 525 KB product all job long, and the
// job took 1.47 times its direct time against 1.07 without queue control
// (bench/figures/computework). A burst's queue is gone when the burst is.
//
// Only while messages cross the bottleneck: when the trunk's express link
// has sent none for queueMsgWindow, a bulk link's queue delays nobody and
// the cap is dropped (a lone bulk transfer then keeps its full rate; the
// cap costs 2-5 % of it in the lab, where ACK timing alone puts srtt 0.5-1
// ms above min_rtt). A trunk without an express link is always capped.
//
// A window cap cannot tell its own queue from another flow's, and against
// a flow that keeps the queue full a capped link would lose its share
// round by round (its rate is cap / (min_rtt + foreign queue)). The cap
// itself allows at most about the target of own queue, so a standing queue
// above it by queueForeignMargin for 4 round trips (at least 100 ms; a dip
// below half the margin starts over) once the cap holds (the peer's
// offered window has come down to it) is someone else's: the cap is
// lifted and the link competes
// with its plain congestion control, then tries again after a hold that
// doubles from 5 s up to 60 s while competition persists.
const (
	queueClampMin  = 16 << 10 // smallest cap: a handful of segments
	queueRefresh   = 250 * time.Millisecond
	queueIdleTick  = 200 * time.Millisecond
	queueHoldFirst = 5 * time.Second
	queueHoldMax   = 60 * time.Second
	// queueForeignMargin is how far above the target a standing queue
	// must stay to be another flow's: above the srtt noise of an idle
	// path (0.5-1 ms in the lab), and small, because a capped link loses
	// rate by (min_rtt + target) / (min_rtt + queue) per round trip to
	// any flow that keeps a queue above the target.
	queueForeignMargin = 2 * time.Millisecond
	// queuePeakBucket x 8 is how long the best rate seen is remembered,
	// counting only time in which rates were measured (buckets age as
	// samples arrive): an idle link forgets nothing, as its path has not
	// changed for all the controller can tell.
	queuePeakBucket = 250 * time.Millisecond
	// queueSaturated is how long a link must have had bytes waiting,
	// without a pause of queueBurstGap, before it is capped: longer than
	// an exchange phase of an MPI code.
	queueSaturated = time.Second
	// queueBurstGap is how long a link must have had nothing waiting for
	// its cap to be dropped: the transfer it capped is over.
	queueBurstGap = 200 * time.Millisecond
	// queueMsgWindow: queue control stays on this long after the last
	// message went out on the express link.
	queueMsgWindow = 5 * time.Second
	// clampMax is the largest cap worth sending: at least the largest
	// window TCP can advertise.
	clampMax = 1 << 30
)

// queueSample is what the controller reads from one TCP_INFO.
type queueSample struct {
	at      time.Time
	srtt    time.Duration
	minRTT  time.Duration
	acked   uint64 // bytes acknowledged, cumulative
	backlog bool   // bytes were waiting to be sent (not app-limited)
	// messages: small messages cross the same bottleneck now (the express
	// link sent some within queueMsgWindow, or there is no express link).
	// Without them a bulk link may keep any queue it likes.
	messages bool
	// inForce: the link can have no more in flight than the cap allows,
	// so a queue above the target is not its own. A receiver never shrinks
	// a window it offered (unless the tcp_shrink_window sysctl allows it),
	// so a cap below it only takes hold as data consumes it: after a bulk
	// run that let the receive buffer autotune to megabytes, that takes
	// tenths of a second.
	inForce bool
}

// queueCtl decides one bulk link's receive-window cap from its sender-side
// samples. It is pure (no clock, no socket) so it can be driven by a model
// of a bottleneck in tests.
type queueCtl struct {
	target time.Duration

	clamp     uint32 // current cap, bytes; 0 = none
	hist      [32]queueSample
	n, next   int
	highSince time.Time // standing queue above the foreign threshold since
	engaged   time.Time // when the current cap was first set
	holdUntil time.Time // lifted: do not cap again before
	hold      time.Duration
	backlog   time.Time // backlogged in every sample since (zero: not now)
	drained   time.Time // not backlogged in any sample since (zero: backlogged now)
	transfer  time.Time // start of the last backlog with no pause of queueBurstGap (zero: none yet)
	sent      uint32    // last value sent to the peer
	sentAt    time.Time
	lifts     uint64
	queue     time.Duration // last standing queue estimate
	rate      float64       // last delivery rate over a round trip, bytes/s
	peak      [8]float64    // largest rate in each of the last 8 buckets of queuePeakBucket
	peakI     int
	peakAt    time.Time // start of bucket peakI

	// offset is the part of srtt - min_rtt that is not queue (learned
	// against min_rtt offMin): see lowered.
	offset time.Duration
	offMin time.Duration
	// lowered: the cap and queue when the cap last started coming down
	// under a queue (zero at: no such run).
	lowered struct {
		at  time.Time
		cap float64
		q   time.Duration
	}
}

// step takes one sample and returns when to sample next and whether to
// send a CLAMP frame carrying c.clamp now.
func (c *queueCtl) step(s queueSample) (next time.Duration, send bool) {
	c.record(s)
	r0 := s.minRTT
	if r0 <= 0 {
		return queueIdleTick, false
	}
	tick := min(max(r0/4, 5*time.Millisecond), 25*time.Millisecond)
	ref, q := c.standingQueue(s)
	if c.trackBacklog(s) {
		// The capped transfer is over: the next one starts free.
		c.free()
		return tick, c.refresh(s.at)
	}
	dt := s.at.Sub(ref.at)
	if dt <= 0 || s.acked == ref.acked {
		if s.backlog {
			// Stalled with bytes waiting: loss recovery holds the
			// cumulative ACK for a round trip or more, and losses come
			// with competition. Nothing to measure, but look again soon:
			// an idle tick here kept a cap spiralling down beside another
			// flow for 200 ms before it could be lifted.
			return tick, false
		}
		// Idle: nothing to measure and nothing to repeat (the receiver's
		// autotuning only moves while data flows); a cap goes once the
		// idle lasts queueBurstGap (trackBacklog).
		return min(queueIdleTick, queueBurstGap/2), false
	}
	if !s.messages {
		// Bulk alone: its queue delays no one (beyond other flows, which
		// the foreign-queue rule leaves alone anyway). Let it run free.
		c.free()
		return tick, c.refresh(s.at)
	}
	if c.backlog.IsZero() || s.at.Sub(c.backlog) < r0 {
		// App-limited within the last round trip (a burst starting or
		// ending): the delivery rate is the application's, not the
		// bottleneck's, and srtt may be stale. Keep the cap.
		return tick, c.refresh(s.at)
	}
	bw := float64(s.acked-ref.acked) / dt.Seconds() // bytes/s
	c.rate = bw
	peak := c.notePeak(s.at, bw)
	if c.clamp == 0 {
		return tick, c.engage(s, q, peak)
	}
	if c.foreignQueue(s, q) {
		c.lift(s.at)
		return tick, c.refresh(s.at)
	}
	c.follow(s, q, bw, peak)
	return tick, c.refresh(s.at)
}

// record keeps s among the last samples.
func (c *queueCtl) record(s queueSample) {
	c.hist[c.next] = s
	c.next = (c.next + 1) % len(c.hist)
	c.n = min(c.n+1, len(c.hist))
}

// standingQueue returns the reference sample, the newest at least one
// round trip older than s (or the oldest kept), and the standing queue:
// the least delay seen since, less the offset (kept in c.queue).
func (c *queueCtl) standingQueue(s queueSample) (ref queueSample, q time.Duration) {
	r0 := s.minRTT
	ref, q = s, s.srtt-r0
	for i := 1; i < c.n; i++ {
		p := c.ago(i)
		ref = p
		if s.at.Sub(p.at) >= r0 {
			break
		}
		q = min(q, p.srtt-r0)
	}
	q = max(q, 0)
	// What min_rtt misses: a round trip measured by TCP timestamps (1 ms
	// resolution) can set it up to 1 ms low, and ACK timing keeps srtt
	// above it even with no queue. Seen as queue, that offset makes the
	// controller lower the cap round after round, each time lowering the
	// rate and never the delay (lowered learns it); a queue below it
	// shows the offset was too large.
	if s.minRTT != c.offMin {
		c.offset, c.offMin = 0, s.minRTT
	}
	c.offset = min(c.offset, q)
	q -= c.offset
	c.queue = q
	return ref, q
}

// trackBacklog follows when the link had bytes waiting and when it had
// none, and reports whether a cap's transfer is over: nothing waiting for
// queueBurstGap.
func (c *queueCtl) trackBacklog(s queueSample) (over bool) {
	if !s.backlog {
		c.backlog = time.Time{}
		if c.drained.IsZero() {
			c.drained = s.at
		}
		return c.clamp != 0 && s.at.Sub(c.drained) >= queueBurstGap
	}
	if c.transfer.IsZero() || !c.drained.IsZero() && s.at.Sub(c.drained) >= queueBurstGap {
		c.transfer = s.at
	}
	c.drained = time.Time{}
	if c.backlog.IsZero() {
		c.backlog = s.at
	}
	return false
}

// free drops the cap without a hold.
func (c *queueCtl) free() {
	c.clamp, c.highSince, c.engaged = 0, time.Time{}, time.Time{}
}

// setpoint is the cap that lets rate through with the target's worth of
// queue: rate x (min_rtt + offset + target), within bounds.
func (c *queueCtl) setpoint(s queueSample, rate float64) float64 {
	return min(max(rate*(s.minRTT+c.offset+c.target).Seconds(), queueClampMin), clampMax)
}

// foreignAt is the standing queue above which a queue under a cap in
// force is another flow's.
func (c *queueCtl) foreignAt() time.Duration { return c.target + queueForeignMargin }

// engage sets the first cap of a transfer that saturates the path, unless
// a lift holds it off; it reports whether to send it.
func (c *queueCtl) engage(s queueSample, q time.Duration, peak float64) bool {
	if q >= c.target && !s.at.Before(c.holdUntil) && s.at.Sub(c.transfer) >= queueSaturated {
		// From the best rate of the last 2 busy seconds, not this
		// sample's: a sample that spans a loss's stalled ACKs reads a
		// fraction of the path and set caps of a few segments. Too
		// high a cap comes down by half per round trip.
		c.clamp, c.engaged, c.highSince = uint32(c.setpoint(s, peak)), s.at, time.Time{}
		return c.refresh(s.at)
	}
	return false
}

// foreignQueue reports whether the queue under the cap has stayed above
// the foreign threshold long enough to be another flow's.
func (c *queueCtl) foreignQueue(s queueSample, q time.Duration) bool {
	switch {
	case q > c.foreignAt() && s.inForce:
		// Too much queue under a cap in force: if it is ours (the
		// bottleneck slowed down), the setpoint drains it within a round
		// trip or two; if it stays, it is not ours. Decide fast: each
		// round trip under another flow's queue costs the link rate.
		if c.highSince.IsZero() {
			c.highSince = s.at
		} else if s.at.Sub(c.highSince) >= max(4*s.minRTT, 100*time.Millisecond) {
			return true
		}
	case q < c.target+queueForeignMargin/2:
		c.highSince = time.Time{} // the queue came down: it was ours
	}
	return false
}

// follow moves the cap with the sample: down toward the setpoint of the
// delivery rate bw while there is a queue, up to the setpoint of the
// best recent rate peak while there is none.
func (c *queueCtl) follow(s queueSample, q time.Duration, bw, peak float64) {
	cur := float64(c.clamp)
	// step is how far this sample may lower the cap: at most half per
	// round trip, as long as the link's round trip is now (a lower cap
	// shows in the queue only that much later). Per min_rtt, a cap
	// under another flow's 20 ms queue fell tenfold in the 100 ms it
	// takes to judge that queue foreign, and BBR, having measured the
	// capped rate, needed seconds to climb back once the cap was lifted.
	step := min(s.at.Sub(c.ago(1).at).Seconds()/max(s.srtt, s.minRTT).Seconds(), 1)
	if q >= c.target {
		if before, ok := c.unmoved(s, q, cur, c.foreignAt()); ok {
			// The cap fell by a tenth and the queue did not: it is not
			// this link's (an offset, or a foreign queue too small to
			// lift for), and a lower cap only costs rate. Count it as
			// offset, so the cap covers it and holds the target above
			// it, and give back what was taken.
			c.offset += q - c.target/2
			q = c.target / 2
			c.queue = q
			cur = before
		}
	}
	if q >= c.target {
		// A queue: the bottleneck is saturated, so the delivery rate is
		// its rate (forget faster ones: the path slowed down or is
		// shared), and the setpoint holds the queue at the target.
		c.resetPeak(bw)
		c.clamp = uint32(max(c.setpoint(s, bw), cur*(1-0.5*step)))
	} else {
		// No queue: let through at least the best rate of the last 2
		// busy seconds plus the target. Its headroom (target / min_rtt)
		// lets a faster path show itself, and the cap follows within
		// round trips.
		c.clamp = uint32(max(cur, c.setpoint(s, peak)))
		c.lowered.at = time.Time{} // not a run of queue samples
	}
	if !c.engaged.IsZero() && s.at.Sub(c.engaged) >= c.hold {
		c.hold = 0 // held without lifting: competition is over
	}
}

// unmoved reports whether the cap, in force, has come down by a tenth or
// more since it started falling under a queue two round trips or more
// ago, every sample since has shown a queue, and that queue q (below the
// foreign threshold) has not come down with the cap; if so, it returns
// the cap from before. (With the queue at the target, samples fall on
// either side of it and a noisy rate sample can drop the cap by a tenth
// at once; an offset shows a queue in every sample.) A link's own queue
// drains within a round trip of a lower cap: a tenth of the cap is a
// tenth of min_rtt + target worth of queue, more than target/4 whenever
// min_rtt exceeds 1.5 x the target.
func (c *queueCtl) unmoved(s queueSample, q time.Duration, cur float64, foreign time.Duration) (float64, bool) {
	lw := &c.lowered
	if !s.inForce {
		lw.at = time.Time{}
		return 0, false
	}
	// Start over whenever the queue came down: what is left is measured
	// from there (a cap coming into force drains the queue built while
	// the peer's window still exceeded it, then any offset shows).
	if q > foreign || lw.at.IsZero() || cur > lw.cap || q < lw.q-c.target/4 {
		lw.at, lw.cap, lw.q = s.at, cur, q
		return 0, false
	}
	if cur > 0.9*lw.cap || s.at.Sub(lw.at) < 2*max(s.srtt, s.minRTT) {
		return 0, false
	}
	lw.at = time.Time{}
	return lw.cap, true
}

// ago returns the sample taken i samples before the newest (i < len(c.hist)).
func (c *queueCtl) ago(i int) queueSample {
	return c.hist[(c.next-1-i+len(c.hist))%len(c.hist)]
}

// notePeak records bw in the current bucket and returns the best rate of
// the last len(c.peak) buckets.
func (c *queueCtl) notePeak(now time.Time, bw float64) float64 {
	if now.Sub(c.peakAt) >= queuePeakBucket {
		c.peakI = (c.peakI + 1) % len(c.peak)
		c.peak[c.peakI], c.peakAt = 0, now
	}
	c.peak[c.peakI] = max(c.peak[c.peakI], bw)
	m := 0.0
	for _, v := range c.peak {
		m = max(m, v)
	}
	return m
}

func (c *queueCtl) resetPeak(bw float64) {
	clear(c.peak[:])
	c.peak[c.peakI] = bw
}

// lift drops the cap: the standing queue is another flow's.
func (c *queueCtl) lift(now time.Time) {
	c.hold = min(max(2*c.hold, queueHoldFirst), queueHoldMax)
	c.free()
	c.holdUntil = now.Add(c.hold)
	c.lifts++
}

// refresh reports whether the peer must hear c.clamp now: it changed by
// more than 1/32, was lifted, or, while data flows, has not been repeated
// for queueRefresh (the receiver's buffer autotuning may have raised its
// window clamp).
func (c *queueCtl) refresh(now time.Time) bool {
	d := int64(c.clamp) - int64(c.sent)
	changed := c.clamp != c.sent && (c.clamp == 0 || c.sent == 0 || 32*max(d, -d) > int64(c.sent))
	if !changed && (c.clamp == 0 || now.Sub(c.sentAt) < queueRefresh) {
		return false
	}
	c.sent, c.sentAt = c.clamp, now
	return true
}

// queueAgg merges the samples of a trunk's bulk links into the one sample
// queue control decides on. The links cross the same bottleneck, so the
// trunk caps their sum: one rate, one queue estimate and one verdict on
// foreign queues for all of them, where controllers of their own would
// each see the others' queue and lift at different times.
type queueAgg struct {
	acked      uint64         // bytes acknowledged by all bulk links, across reconnects
	last, next map[any]uint64 // each link's BytesAcked at the previous sample
}

// linkQueueSample is one bulk link's share of a sample; key tells links
// apart across samples.
type linkQueueSample struct {
	key          any
	srtt, minRTT time.Duration
	acked        uint64
	backlog      bool
	sndWnd       uint32 // the peer's advertised window (tcpi_snd_wnd)
	inflight     uint32 // bytes sent and not yet acknowledged
}

// merge returns the trunk's sample at now. Its min_rtt is the least of the
// links'; its queue the least srtt - min_rtt of the links whose ACKs moved
// since the last sample (an idle link's srtt is stale), or of all of them
// when none moved; its acknowledged bytes sum the links' progress (a new
// or replaced link counts from its first sample). Backlogged: any link.
func (a *queueAgg) merge(now time.Time, ls []linkQueueSample, messages bool) queueSample {
	s := queueSample{at: now, messages: messages}
	if a.next == nil {
		a.last, a.next = map[any]uint64{}, map[any]uint64{}
	}
	clear(a.next)
	qAll, qFresh := time.Duration(-1), time.Duration(-1)
	for _, l := range ls {
		a.next[l.key] = l.acked
		prev, known := a.last[l.key]
		moved := known && l.acked > prev
		if moved {
			a.acked += l.acked - prev
		}
		s.backlog = s.backlog || l.backlog
		if l.minRTT <= 0 {
			continue
		}
		if s.minRTT == 0 || l.minRTT < s.minRTT {
			s.minRTT = l.minRTT
		}
		q := max(l.srtt-l.minRTT, 0)
		if qAll < 0 || q < qAll {
			qAll = q
		}
		if moved && (qFresh < 0 || q < qFresh) {
			qFresh = q
		}
	}
	a.last, a.next = a.next, a.last
	s.acked = a.acked
	if qFresh >= 0 {
		qAll = qFresh
	}
	s.srtt = s.minRTT + max(qAll, 0)
	return s
}

// trunkQueue is queue control for a trunk: it merges its bulk links'
// samples, decides one cap and splits it evenly over them. Striping hands
// each chunk to the bulk link with the least queued, so while the trunk is
// backlogged every link is too, and even caps keep their sum at the cap.
// Pure, like queueCtl.
type trunkQueue struct {
	ctl     queueCtl
	agg     queueAgg
	sentTo  map[any]uint32 // the cap each link last heard
	sends   []queueSend
	shares  []timedShare // the per-link caps of the last round trips, oldest first
	inForce bool         // at the last step (for the log)
	peerWnd uint32       // the largest window a peer offered at the last step
	flight  uint32       // the largest in-flight bound judged at the last step (window, or bytes in flight of a link with none waiting)

	in  []linkQueueSample // Step's scratch
	out []*relay.Link
}

type timedShare struct {
	at    time.Time
	share uint32
}

// queueSend is a CLAMP frame to send on the link key.
type queueSend struct {
	key   any
	clamp uint32
}

// step takes the links' samples at now and returns when to sample next,
// each link's cap, and the CLAMP frames to send: to every link when the
// controller refreshes, else to links whose cap moved (a new link starts
// uncapped, so it hears a cap when there is one).
func (q *trunkQueue) step(now time.Time, ls []linkQueueSample, messages bool) (next time.Duration, share uint32, sends []queueSend) {
	if q.sentTo == nil {
		q.sentTo = map[any]uint32{}
	}
	s := q.agg.merge(now, ls, messages)
	// The cap holds on a link once it heard one and it can have no more in
	// flight than within an eighth (plus window-scale rounding) of the
	// largest cap of the last 1.5 round trips: the window a sender sees
	// answers a cap sent a round trip before, and a cap may halve per
	// round trip. A link with bytes waiting puts in flight all the window
	// its peer offers, and that window comes down to a cap only as data
	// consumes it, so the window is what counts. A link with none waiting
	// has in flight all it will have until more comes; its window may be
	// the megabytes a bulk run left it for minutes (striping gives chunks
	// to the least queued link, so a link that carries few keeps it).
	// Judged on the window alone, such a link kept the trunk's cap from
	// ever counting as held: against another flow's queue the cap was
	// never lifted and the busy link sat at queueClampMin.
	recent := s.srtt + s.srtt/2
	i := 0
	for i < len(q.shares)-1 && now.Sub(q.shares[i+1].at) >= recent {
		i++ // shares[i] was still in force when shares[i+1] replaced it
	}
	q.shares = q.shares[i:]
	var hold uint32
	for _, h := range q.shares {
		hold = max(hold, h.share)
	}
	s.inForce, q.peerWnd, q.flight = len(ls) > 0, 0, 0
	for _, l := range ls {
		w := l.sndWnd
		if !l.backlog {
			w = min(w, l.inflight)
		}
		s.inForce = s.inForce && q.sentTo[l.key] != 0 && uint64(w) <= uint64(hold)+uint64(hold)/8+64<<10
		q.peerWnd, q.flight = max(q.peerWnd, l.sndWnd), max(q.flight, w)
	}
	q.inForce = s.inForce
	next, all := q.ctl.step(s)
	if q.ctl.clamp != 0 && len(ls) > 0 {
		share = max(q.ctl.clamp/uint32(len(ls)), queueClampMin)
	}
	if n := len(q.shares); n == 0 || q.shares[n-1].share != share {
		q.shares = append(q.shares, timedShare{now, share})
	}
	q.sends = q.sends[:0]
	for _, l := range ls {
		if all || q.sentTo[l.key] != share {
			q.sends = append(q.sends, queueSend{l.key, share})
			q.sentTo[l.key] = share
		}
	}
	for k := range q.sentTo {
		if !slices.ContainsFunc(ls, func(l linkQueueSample) bool { return l.key == k }) {
			delete(q.sentTo, k)
		}
	}
	return next, share, q.sends
}

// QueueControl is the relay's queue-control hook (relay.Config.QueueControl)
// for a target queue: each trunk gets a controller of its own. Nil for a
// target of 0 (queue control off).
func QueueControl(target time.Duration) func() relay.QueueController {
	if target <= 0 {
		return nil
	}
	return func() relay.QueueController { return &trunkQueue{ctl: queueCtl{target: target}} }
}

// Step implements relay.QueueController: the cap is on only while
// messages went out within queueMsgWindow.
func (q *trunkQueue) Step(now time.Time, links []relay.QueueSample, lastMessage time.Time) relay.QueueDecision {
	messages := !lastMessage.IsZero() && now.Sub(lastMessage) < queueMsgWindow
	q.in = q.in[:0]
	for _, l := range links {
		q.in = append(q.in, linkQueueSample{key: l.Link, srtt: l.SRTT, minRTT: l.MinRTT, acked: l.Acked,
			backlog: l.Backlog, sndWnd: l.SndWnd, inflight: l.Inflight})
	}
	next, share, sends := q.step(now, q.in, messages)
	d := relay.QueueDecision{Next: next, Share: share, Queue: q.ctl.queue, Lifts: q.ctl.lifts, Send: q.out[:0]}
	for _, s := range sends {
		d.Send = append(d.Send, s.key.(*relay.Link))
	}
	q.out = d.Send
	if len(d.Send) > 0 {
		c := &q.ctl
		d.Log = []any{"clamp", c.clamp, "per_link", share, "queue", c.queue, "offset", c.offset,
			"min_rtt", c.ago(0).minRTT, "rate_mbit", c.rate * 8 / 1e6, "lifts", c.lifts,
			"in_force", q.inForce, "peer_wnd", q.peerWnd, "flight_bound", q.flight}
	}
	return d
}
