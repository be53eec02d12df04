package tcpinfo

import (
	"fmt"
	"math"
	"time"
)

// Kind is the kind of an Event.
type Kind uint8

const (
	// RetransFast: segments retransmitted by fast retransmit / recovery
	// (dup ACKs or SACK), without a timeout. Count = segments.
	RetransFast Kind = iota + 1
	// RetransRTO: segments retransmitted in an interval in which a
	// retransmission timeout fired or that began or ended in the Loss
	// state. Count = segments.
	RetransRTO
	// RTO: retransmission timeouts. Count = timeouts (exact with
	// tcpi_total_rto, Linux 6.7+; otherwise at least 1 per interval with
	// backoff growth or a new Loss episode).
	RTO
	// Lost: segments newly marked lost. TCP_INFO only has the current
	// number (tcpi_lost), so this counts its increases between samples: a
	// lower bound.
	Lost
	// Reordering: reordering events (tcpi_reord_seen growth). Count = events.
	Reordering
	// SpuriousRetrans: retransmissions the peer reported as duplicates
	// (D-SACK). Count = segments.
	SpuriousRetrans
	// CwndChange: the congestion window changed. From/To = segments.
	CwndChange
	// SsthreshChange: the slow start threshold changed. From/To = segments.
	SsthreshChange
	// IdleRestart: the congestion window collapsed after an idle period
	// longer than the RTO with no retransmission, no loss, no RTO and no
	// recovery state (Linux tcp_slow_start_after_idle). From/To = cwnd.
	// Idle = the longest idle period the samples allow.
	IdleRestart
	// CAStateChange: the congestion-avoidance state changed (CAOpen ...).
	CAStateChange
)

var kindNames = [...]string{
	RetransFast: "retrans-fast", RetransRTO: "retrans-rto", RTO: "rto", Lost: "lost",
	Reordering: "reordering", SpuriousRetrans: "spurious-retrans", CwndChange: "cwnd",
	SsthreshChange: "ssthresh", IdleRestart: "idle-restart", CAStateChange: "ca-state",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is something that happened between two samples.
type Event struct {
	Kind     Kind
	At       time.Time // time of the sample that revealed it
	Count    uint64
	From, To uint32
	Idle     time.Duration // IdleRestart only
}

func (e Event) String() string {
	switch e.Kind {
	case CwndChange, SsthreshChange, CAStateChange:
		return fmt.Sprintf("%s %d->%d", e.Kind, e.From, e.To)
	case IdleRestart:
		return fmt.Sprintf("%s cwnd %d->%d after idle <= %v", e.Kind, e.From, e.To, e.Idle)
	}
	return fmt.Sprintf("%s %d", e.Kind, e.Count)
}

// Counters accumulate what a Tracker derived over a connection's samples.
type Counters struct {
	Samples      uint64
	RetransFast  uint64 // segments
	RetransRTO   uint64 // segments
	RTOs         uint64
	Lost         uint64 // lower bound, see Lost
	Reorderings  uint64
	Spurious     uint64
	CwndChanges  uint64
	IdleRestarts uint64
	// BBR's PROBE_RTT dips seen by UpdateBBR, and their time (to within
	// the sampling period; a dip still under way is not counted in).
	ProbeRTTs    uint64
	ProbeRTTTime time.Duration

	// Latest cumulative kernel values.
	TotalRetrans  uint32
	BytesAcked    uint64
	BytesSent     uint64
	BytesRetrans  uint64
	BusyTime      time.Duration
	RwndLimited   time.Duration
	SndbufLimited time.Duration
	DeliveryRate  uint64 // bytes/s, latest sample
	MaxCwnd       uint32

	// Sample statistics of the smoothed RTT (Welford).
	rttN    uint64
	rttMean float64 // µs
	rttM2   float64
}

// RTTMean is the mean of the sampled smoothed RTT.
func (c *Counters) RTTMean() time.Duration {
	return time.Duration(c.rttMean * float64(time.Microsecond))
}

// RTTStdDev is the standard deviation of the sampled smoothed RTT across
// samples (the kernel's own RTTVar is the deviation within its estimator).
func (c *Counters) RTTStdDev() time.Duration {
	if c.rttN < 2 {
		return 0
	}
	return time.Duration(math.Sqrt(c.rttM2/float64(c.rttN-1)) * float64(time.Microsecond))
}

// Fractions of the busy time limited by the receiver window, by the send
// buffer, and by the rest (congestion window or pacing). Zero when the
// connection never had data to send.
func (c *Counters) Fractions() (rwnd, sndbuf, cwnd float64) {
	if c.BusyTime <= 0 {
		return 0, 0, 0
	}
	b := float64(c.BusyTime)
	rwnd, sndbuf = float64(c.RwndLimited)/b, float64(c.SndbufLimited)/b
	return rwnd, sndbuf, max(0, 1-rwnd-sndbuf)
}

// IntervalFractions is Fractions for the interval between two samples of
// one connection: what limited sending while it was busy in that interval.
func IntervalFractions(prev, cur *Info) (rwnd, sndbuf, cwnd float64) {
	busy := cur.BusyTime - prev.BusyTime
	if busy <= 0 {
		return 0, 0, 0
	}
	b := float64(busy)
	rwnd = max(0, float64(cur.RwndLimited-prev.RwndLimited)/b)
	sndbuf = max(0, float64(cur.SndbufLimited-prev.SndbufLimited)/b)
	return rwnd, sndbuf, max(0, 1-rwnd-sndbuf)
}

// Tracker derives events from consecutive samples of one connection. The
// zero value is ready; it is not safe for concurrent use.
type Tracker struct {
	// CongestionControl of the socket, if known (see CongestionControl):
	// "bbr" never restarts after idle in Linux, so a loss-free collapse
	// (PROBE_RTT) is not reported as one.
	CongestionControl string

	prev   Info
	prevAt time.Time
	have   bool
	C      Counters

	bbr           BBR // the last UpdateBBR sample
	haveBBR       bool
	inProbeRTT    bool
	probeRTTSince time.Time
}

// Last returns the previous sample, if any.
func (t *Tracker) Last() (Info, time.Time, bool) { return t.prev, t.prevAt, t.have }

// Update takes the sample cur taken at time at, updates the counters and
// appends the derived events to ev (pass ev[:0] of a reused slice to avoid
// allocating). The first sample only sets the baseline.
func (t *Tracker) Update(at time.Time, cur *Info, ev []Event) []Event {
	c := &t.C
	c.Samples++
	c.TotalRetrans = cur.TotalRetrans
	c.BytesAcked, c.BytesSent, c.BytesRetrans = cur.BytesAcked, cur.BytesSent, cur.BytesRetrans
	c.BusyTime, c.RwndLimited, c.SndbufLimited = cur.BusyTime, cur.RwndLimited, cur.SndbufLimited
	c.DeliveryRate = cur.DeliveryRate
	c.MaxCwnd = max(c.MaxCwnd, cur.SndCwnd)
	if cur.RTT > 0 {
		c.rttN++
		x := float64(cur.RTT) / float64(time.Microsecond)
		d := x - c.rttMean
		c.rttMean += d / float64(c.rttN)
		c.rttM2 += d * (x - c.rttMean)
	}
	if !t.have {
		t.prev, t.prevAt, t.have = *cur, at, true
		return ev
	}
	p := &t.prev
	add := func(e Event) { e.At = at; ev = append(ev, e) }

	// RTOs: exact count from total_rto when the kernel has it; otherwise
	// evidence is backoff growth or entering the Loss state.
	var rtos uint64
	if cur.Has(FieldTotalRTO) && p.Has(FieldTotalRTO) {
		rtos = uint64(uint16(cur.TotalRTO - p.TotalRTO))
	} else if cur.Backoff > p.Backoff || (cur.CAState == CALoss && p.CAState != CALoss) {
		rtos = 1
	}
	// Retransmissions of an interval that saw an RTO or began or ended in
	// the Loss state are the timeout's recovery (go-back-N in slow start).
	inLoss := rtos > 0 || cur.CAState == CALoss || p.CAState == CALoss
	if rtos > 0 {
		c.RTOs += rtos
		add(Event{Kind: RTO, Count: rtos})
	}
	retrans := uint64(cur.TotalRetrans - p.TotalRetrans) // wraps correctly in uint32
	if retrans > 0 {
		if inLoss {
			c.RetransRTO += retrans
			add(Event{Kind: RetransRTO, Count: retrans})
		} else {
			c.RetransFast += retrans
			add(Event{Kind: RetransFast, Count: retrans})
		}
	}
	if cur.Lost > p.Lost {
		n := uint64(cur.Lost - p.Lost)
		c.Lost += n
		add(Event{Kind: Lost, Count: n})
	}
	if n := uint64(cur.ReordSeen - p.ReordSeen); n > 0 {
		c.Reorderings += n
		add(Event{Kind: Reordering, Count: n})
	}
	if n := uint64(cur.DSACKDups - p.DSACKDups); n > 0 {
		c.Spurious += n
		add(Event{Kind: SpuriousRetrans, Count: n})
	}
	if cur.CAState != p.CAState {
		add(Event{Kind: CAStateChange, From: uint32(p.CAState), To: uint32(cur.CAState)})
	}
	if cur.SndSsthresh != p.SndSsthresh {
		add(Event{Kind: SsthreshChange, From: p.SndSsthresh, To: cur.SndSsthresh})
	}
	if cur.SndCwnd != p.SndCwnd {
		c.CwndChanges++
		add(Event{Kind: CwndChange, From: p.SndCwnd, To: cur.SndCwnd})
		if idle, ok := idleRestart(p, t.prevAt, cur, at, retrans, rtos); ok && !ownCongControl(t.CongestionControl) {
			c.IdleRestarts++
			add(Event{Kind: IdleRestart, From: p.SndCwnd, To: cur.SndCwnd, Idle: idle})
		}
	}
	t.prev, t.prevAt = *cur, at
	return ev
}

// idleRestart recognises Linux's restart after idle (tcp_cwnd_restart): when
// data is sent after more than an RTO without any, cwnd is halved once per
// RTO of idleness, down to the initial window; loss-free, so the CA state
// stays Open/Disorder and no segment is retransmitted.
//
// Samples only bound the idle period: the last send seen by the previous
// sample was at prevAt-LastDataSent; the first new send happened at the
// latest at at-cur.LastDataSent. The idle period is at most the difference,
// and at least p.LastDataSent (the previous sample saw that much idleness).
// A restart needs the upper bound to exceed the RTO and the drop to be at
// least a halving (or to the 10-segment initial window), growth since the
// restart discounted; smaller loss-free reductions (RFC 2861 validation of
// an application-limited sender, ECN) are left as plain CwndChange events.
// Congestion controls with their own cong_control (BBR) never restart:
// Linux skips tcp_cwnd_restart for them.
func idleRestart(p *Info, prevAt time.Time, cur *Info, at time.Time, retrans, rtos uint64) (time.Duration, bool) {
	if cur.SndCwnd >= p.SndCwnd || retrans > 0 || rtos > 0 || cur.Lost > p.Lost {
		return 0, false
	}
	if cur.CAState != CAOpen && cur.CAState != CADisorder || p.CAState != CAOpen && p.CAState != CADisorder {
		return 0, false
	}
	if cur.SegsOut == p.SegsOut {
		return 0, false // nothing was sent: the reduction came from elsewhere
	}
	// After the restart the window grows again in slow start, by one
	// segment per segment delivered: take that growth off before comparing.
	grow := cur.SegsOut - p.SegsOut
	if cur.Has(FieldBytesSent) && p.Has(FieldBytesSent) {
		grow = cur.Delivered - p.Delivered
	}
	base := cur.SndCwnd - min(grow, cur.SndCwnd)
	const initWindow = 10 // TCP_INIT_CWND; the restart never goes below it
	if base > p.SndCwnd/2 && base > initWindow {
		return 0, false
	}
	lastBefore := prevAt.Add(-p.LastDataSent)
	firstAfter := at.Add(-cur.LastDataSent)
	idle := firstAfter.Sub(lastBefore)
	rto := max(p.RTO, cur.RTO)
	if idle <= rto {
		return 0, false
	}
	return idle, true
}

// ownCongControl: congestion controls that implement cong_control, for
// which Linux skips tcp_cwnd_restart.
func ownCongControl(cc string) bool { return cc == "bbr" || cc == "bbr2" || cc == "bbr3" }
