package tuning

import (
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// Express control renews the express link when its congestion window is
// cold: loss recovery has set the slow-start threshold below one message
// of the largest size (ExpressMax) and the window is still below it.
// Messages are app-limited, so such a window hardly grows again, and
// every message larger than it costs extra round trips; a fresh
// connection starts in slow start and grows to twice the largest message
// within a few (bench/figures/express). Each side judges the window it
// sends with: the dialer dials, the acceptor asks it to with RENEW (the
// relay carries the decision out: relay.Trunk.StepExpress).
//
// A cold window that comes with another flow's queue also holds the
// express link aside (relay.Trunk.HoldExpress): the express link's min
// RTT stands yieldQueue above the path's (foreignQueue), which the first
// cold window of an express link that started before that flow does not
// show, and the one after its renewal does. Against such a flow a message
// waits in its queue on any link, and there the CUBIC express link,
// renewed as losses cut it, starts again from 10 segments about once a
// second, while the primed BBR bulk link keeps its window
// (bench/figures/computework: LU, MG and CG at 0.94-1.04 of direct
// without the express link, 1.23-2.23 with it). The hold doubles from
// yieldFirst to yieldMax while holds follow each other, and starts over
// at yieldFirst after one hold's worth of time with none; at its end the
// express link is tried again. The controller runs at each sample of the
// gateway's WAN sampler, right after it has read every link's TCP_INFO,
// whose samples it uses; the bulk links' are read only on a cold window.

// How long a hold of the express link lasts: the first one, and at most,
// doubling while holds follow each other.
const (
	yieldFirst = 10 * time.Second
	yieldMax   = time.Minute
)

// ExpressControl is the relay's express-control hook
// (relay.Config.ExpressControl) for messages of up to max bytes: renew
// replaces a cold express link (--wan-express-renew), yield holds it
// aside while another flow keeps the WAN queue full (--wan-express-yield).
// Each trunk gets a controller of its own. Nil when both are off.
func ExpressControl(renew, yield bool, max int) func() relay.ExpressController {
	if !renew && !yield {
		return nil
	}
	return func() relay.ExpressController { return &expressCtl{renew: renew, yield: yield, max: max} }
}

// expressCtl is one trunk's express controller.
type expressCtl struct {
	renew, yield bool
	max          int
	// yieldEnd and yieldNext are when the last hold ends and how long the
	// next one lasts.
	yieldEnd  time.Time
	yieldNext time.Duration
}

// Step implements relay.ExpressController.
func (c *expressCtl) Step(now time.Time, s relay.ExpressSample) relay.ExpressDecision {
	var d relay.ExpressDecision
	x := s.Info
	if !expressCold(x.SndCwnd, x.SndSsthresh, x.SndMSS, c.max) {
		return d
	}
	if c.yield && !s.Held {
		if q, base, ok := foreignQueue(x, s.Bulk()); ok {
			d.Hold = c.nextYield(now)
			d.Log = []any{"queue", q.Round(100 * time.Microsecond).String(), "min_rtt", base.Round(100 * time.Microsecond).String(),
				"express_cwnd", x.SndCwnd, "for", d.Hold.String()}
		}
	}
	d.Renew = c.renew
	return d
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

// yieldQueue is the standing queue, above a path's min RTT of base, that
// only another flow keeps: a quarter of the path's round trip and at
// least 4 ms, above what the messages of one exchange and a bulk link
// under queue control (1 ms by default) add.
func yieldQueue(base time.Duration) time.Duration { return max(base/4, 4*time.Millisecond) }

// foreignQueue reports whether the express link's TCP_INFO x shows
// another flow's queue, given the bulk links' bulk. The queue q is x's min
// RTT over the path's, base: what stood under every round trip x measured
// in its life. The long-lived bulk links know the path's min RTT; an
// express link renewed under another flow's queue never sees it. A queue
// of our own comes and goes with our bursts (the first segments after a
// pause cross an empty one), so it does not stand under all of a link's
// samples, unless our own bulk kept it full all along: so none may wait in
// a bulk link's socket, and the part of q that the bulk links' bytes in
// flight can account for does not count (by Little's law they take
// inflight / rate to cross, rate being the bulk links' latest delivery
// rates summed, which read low at a burst's tail and leave more to our own
// bulk).
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
func (c *expressCtl) nextYield(now time.Time) time.Duration {
	hold := c.yieldNext
	if hold == 0 || now.Sub(c.yieldEnd) > hold {
		hold = yieldFirst
	}
	c.yieldEnd, c.yieldNext = now.Add(hold), min(2*hold, yieldMax)
	return hold
}
