package tuning

import (
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// TestExpressCold: when a socket's window counts as too cold for messages.
func TestExpressCold(t *testing.T) {
	const inf = tcpinfo.InfiniteSsthresh
	for _, c := range []struct {
		cwnd, ssthresh, mss uint32
		max                 int
		want                bool
	}{
		{10, inf, 1448, 68 << 10, false}, // first slow start
		{14, 7, 1448, 68 << 10, true},    // cut while messages were small
		{45, 44, 1448, 68 << 10, true},   // 49 segments make a 68 KiB message
		{49, 44, 1448, 68 << 10, false},  // the window holds one message
		{30, 49, 1448, 68 << 10, false},  // recovering in slow start up to 49
		{10, 7, 1448, 8 << 10, false},    // small messages fit
		{14, 7, 0, 68 << 10, false},      // no MSS yet
	} {
		if got := expressCold(c.cwnd, c.ssthresh, c.mss, c.max); got != c.want {
			t.Errorf("cwnd %d ssthresh %d mss %d max %d: cold %v, want %v", c.cwnd, c.ssthresh, c.mss, c.max, got, c.want)
		}
	}
}

// TestForeignQueue: the express link's min RTT against the path's, taken
// from the long-lived bulk links, tells another flow's standing queue; a
// queue in its smoothed RTT alone comes and goes with our own bursts; our
// own bulk waiting, or in flight enough to account for the queue, may be
// what queues.
func TestForeignQueue(t *testing.T) {
	ms := time.Millisecond
	x := func(rtt, min time.Duration) tcpinfo.Info { return tcpinfo.Info{RTT: rtt, MinRTT: min} }
	bulk := func(min time.Duration, notsent uint32) tcpinfo.Info {
		return tcpinfo.Info{MinRTT: min, NotsentBytes: notsent}
	}
	flying := func(min time.Duration, bytes, rate float64) tcpinfo.Info {
		return tcpinfo.Info{MinRTT: min, SndMSS: 1000, Unacked: uint32(bytes / 1000), DeliveryRate: uint64(rate)}
	}
	for _, c := range []struct {
		name   string
		x      tcpinfo.Info
		bulk   []tcpinfo.Info
		want   bool
		q, min time.Duration
	}{
		{"a foreign flow's 15 ms queue under every sample", x(40*ms, 35*ms), []tcpinfo.Info{bulk(20*ms, 0), bulk(21*ms, 0)}, true, 15 * ms, 20 * ms},
		{"a queue in the smoothed RTT only: our burst's", x(40*ms, 21*ms), []tcpinfo.Info{bulk(20*ms, 0)}, false, 1 * ms, 20 * ms},
		{"below a quarter of the round trip", x(30*ms, 24*ms), []tcpinfo.Info{bulk(20*ms, 0)}, false, 4 * ms, 20 * ms},
		{"at least 4 ms on a short path", x(6*ms, 5*ms), []tcpinfo.Info{bulk(1*ms, 0)}, true, 4 * ms, 1 * ms},
		{"3.9 ms on a short path", x(6*ms, 4900*time.Microsecond), []tcpinfo.Info{bulk(1*ms, 0)}, false, 3900 * time.Microsecond, 1 * ms},
		{"our own bulk waits", x(45*ms, 40*ms), []tcpinfo.Info{bulk(20*ms, 0), bulk(20*ms, 1)}, false, 0, 0},
		// 1 MB in flight at 25 MB/s takes 40 ms: 20 ms of the queue is ours.
		{"our own bulk in flight", x(45*ms, 40*ms), []tcpinfo.Info{flying(20*ms, 1e6, 25e6)}, false, 20 * ms, 20 * ms},
		// 600 KB at 25 MB/s: 4 ms of a 15 ms queue is ours, 11 ms foreign.
		{"a foreign queue beside a little of our own", x(40*ms, 35*ms), []tcpinfo.Info{flying(20*ms, 600e3, 25e6)}, true, 15 * ms, 20 * ms},
		{"bytes in flight and no rate yet", x(45*ms, 40*ms), []tcpinfo.Info{flying(20*ms, 10e3, 0)}, false, 20 * ms, 20 * ms},
		{"no bulk link: the path's min RTT unknown", x(45*ms, 40*ms), nil, false, 0, 0},
		{"no min RTT on the express link yet", x(45*ms, 0), []tcpinfo.Info{bulk(20*ms, 0)}, false, 0, 20 * ms},
	} {
		q, min, ok := foreignQueue(c.x, c.bulk)
		if ok != c.want || q != c.q || min != c.min {
			t.Errorf("%s: queue %v over %v, foreign %v; want %v over %v, %v", c.name, q, min, ok, c.q, c.min, c.want)
		}
	}
}

// TestNextYield: holds of the express link double while they follow each
// other, up to a minute, and start again at 10 s after a gap.
func TestNextYield(t *testing.T) {
	c := &expressCtl{}
	t0 := time.Unix(1000, 0)
	at := t0
	for i, want := range []time.Duration{10, 20, 40, 60, 60} {
		if got := c.nextYield(at); got != want*time.Second {
			t.Fatalf("hold %d: %v, want %vs", i, got, want)
		}
		at = c.yieldEnd.Add(2 * time.Second) // a renewal or two after its end
	}
	if got := c.nextYield(c.yieldEnd.Add(61 * time.Second)); got != yieldFirst {
		t.Fatalf("after a minute with no hold: %v, want %v", got, yieldFirst)
	}
}

// TestExpressControl: a cold express window is renewed (--wan-express-renew)
// and, beside another flow's queue, held aside (--wan-express-yield), not
// while a hold runs; a warm one is left alone; the bulk links' samples are
// read only for a cold window that may yield; with both off there is no
// controller.
func TestExpressControl(t *testing.T) {
	if ExpressControl(false, false, 68<<10) != nil {
		t.Error("a controller with renewal and yield both off")
	}
	ms := time.Millisecond
	cold := tcpinfo.Info{SndCwnd: 14, SndSsthresh: 7, SndMSS: 1448, MinRTT: 35 * ms}
	warm := tcpinfo.Info{SndCwnd: 10, SndSsthresh: tcpinfo.InfiniteSsthresh, SndMSS: 1448, MinRTT: 35 * ms}
	path := []tcpinfo.Info{{MinRTT: 20 * ms}} // a bulk link: the path's min RTT
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name         string
		renew, yield bool
		x            tcpinfo.Info
		held         bool
		bulk         []tcpinfo.Info
		wantRenew    bool
		wantHold     time.Duration
		wantBulk     bool // the bulk links' samples were read
	}{
		{"warm", true, true, warm, false, path, false, 0, false},
		{"cold beside a foreign queue", true, true, cold, false, path, true, yieldFirst, true},
		{"cold, no foreign queue", true, true, cold, false, []tcpinfo.Info{{MinRTT: 34 * ms}}, true, 0, true},
		{"cold during a hold", true, true, cold, true, path, true, 0, false},
		{"cold, renewal only", true, false, cold, false, path, true, 0, false},
		{"cold, yield only", false, true, cold, false, path, false, yieldFirst, true},
	} {
		ctl := ExpressControl(c.renew, c.yield, 68<<10)()
		read := false
		d := ctl.Step(now, relay.ExpressSample{Info: c.x, Held: c.held, Bulk: func() []tcpinfo.Info { read = true; return c.bulk }})
		if d.Renew != c.wantRenew || d.Hold != c.wantHold || read != c.wantBulk {
			t.Errorf("%s: renew %v, hold %v, bulk read %v; want %v, %v, %v", c.name, d.Renew, d.Hold, read, c.wantRenew, c.wantHold, c.wantBulk)
		}
		if (d.Hold > 0) != (len(d.Log) > 0) {
			t.Errorf("%s: hold %v logged as %v", c.name, d.Hold, d.Log)
		}
	}
}
