package relay

import (
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// stepCtl is an express controller that records its samples and returns d.
type stepCtl struct {
	d       ExpressDecision
	samples []ExpressSample
	bulk    [][]tcpinfo.Info
}

func (c *stepCtl) Step(now time.Time, s ExpressSample) ExpressDecision {
	c.samples = append(c.samples, s)
	c.bulk = append(c.bulk, s.Bulk())
	return c.d
}

// TestStepExpress: StepExpress runs one controller per trunk on the
// express link's sample, with the bulk links' on demand, and carries out
// its decision: a hold, and a renewal by the dialer's OnRenew, or, on the
// accepting side, by RENEW, which makes the dialer's OnRenew run. Without
// a sample of the express link, or a controller, nothing happens.
func TestStepExpress(t *testing.T) {
	var ctls []*stepCtl
	cfg := Config{ExpressControl: func() ExpressController {
		c := &stepCtl{}
		ctls = append(ctls, c)
		return c
	}}
	ta, tb, as, bs := trunkPairF(t, cfg, 1, true, header.FeatureRenew)
	renewed := make(chan struct{}, 4)
	ta.OnRenew(func() { renewed <- struct{}{} })
	info := map[*Link]tcpinfo.Info{as[0]: {SndCwnd: 1}, as[1]: {SndCwnd: 2}, bs[0]: {SndCwnd: 3}, bs[1]: {SndCwnd: 4}}
	last := func(l *Link) (tcpinfo.Info, bool) { in, ok := info[l]; return in, ok }
	now := time.Now()

	if d := ta.StepExpress(now, last); d.Renew || d.Hold != 0 || len(ctls) != 1 {
		t.Fatalf("a step deciding nothing: %+v, %d controllers", d, len(ctls))
	}
	c := ctls[0]
	if s := c.samples[0]; s.Info.SndCwnd != 2 || s.Held || len(c.bulk[0]) != 1 || c.bulk[0][0].SndCwnd != 1 {
		t.Fatalf("sample %+v, bulk %+v: want the express link's (cwnd 2), no hold, the bulk link's (cwnd 1)", s, c.bulk[0])
	}
	select {
	case <-renewed:
		t.Fatal("renewed without a decision to")
	default:
	}

	c.d = ExpressDecision{Renew: true, Hold: time.Minute}
	ta.StepExpress(now, last)
	if !ta.ExpressHeld(time.Now()) || tb.ExpressHeld(time.Now()) {
		t.Error("the hold is not on the deciding trunk alone")
	}
	select {
	case <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("the dialer's decision to renew did not run OnRenew")
	}
	c.d = ExpressDecision{}
	ta.StepExpress(now.Add(time.Second), last)
	if len(ctls) != 1 || !c.samples[2].Held {
		t.Errorf("%d controllers, held %v at the third step: want one, held", len(ctls), c.samples[2].Held)
	}

	// The acceptor's decision goes to the dialer as RENEW.
	tb.StepExpress(now, last)
	if len(ctls) != 2 {
		t.Fatalf("%d controllers, want one per trunk", len(ctls))
	}
	ctls[1].d = ExpressDecision{Renew: true}
	tb.StepExpress(now, last)
	select {
	case <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("the acceptor's decision to renew did not reach the dialer's OnRenew")
	}

	delete(info, as[1])
	n := len(c.samples)
	if ta.StepExpress(now, last); len(c.samples) != n {
		t.Error("a step without a sample of the express link")
	}
	tc, _, _, _ := trunkPair(t, Config{}, 1, true)
	if d := tc.StepExpress(now, func(*Link) (tcpinfo.Info, bool) { return tcpinfo.Info{}, true }); d.Renew || d.Hold != 0 {
		t.Errorf("a trunk without a controller decided %+v", d)
	}
}
