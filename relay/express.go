package relay

// Express control: the hook through which a WAN tuning policy decides when
// a trunk's express link is renewed and when it is held aside (package
// tuning implements it; bench/figures/express, bench/figures/computework).
// The caller that samples the links' TCP_INFO (the gateway's WAN sampler)
// hands each trunk its latest samples, and one step runs:
//
//  1. StepExpress: the express link's latest sample, whether a hold is in
//     force, and the bulk links' samples on demand (ExpressSample.Bulk);
//  2. ExpressController.Step: the policy decides (ExpressDecision);
//  3. HoldExpress (trunk.go) for a hold, then the renewal: the dialing
//     side's OnRenew (a fresh link), or RENEW to the peer, which dials
//     (Link.RequestRenew, renew.go).

import (
	"time"

	"github.com/mpi5k/mpi5k/tcpinfo"
)

// ExpressController decides the renewals and holds of a trunk's express
// link from TCP_INFO samples. One runs per trunk (Config.ExpressControl
// makes it at the trunk's first step with an express link); Step is
// called from one goroutine at a time.
type ExpressController interface {
	// Step takes the express link's latest sample at now.
	Step(now time.Time, s ExpressSample) ExpressDecision
}

// ExpressSample is what an express controller reads at one step.
type ExpressSample struct {
	Info tcpinfo.Info // the express link's latest TCP_INFO
	// Held: a hold (HoldExpress) keeps this side's messages off the
	// express link at now.
	Held bool
	// Bulk returns the latest TCP_INFO of each of the trunk's bulk links
	// that has one. It reads the sampler's store, so a controller calls it
	// only when it needs them.
	Bulk func() []tcpinfo.Info
}

// ExpressDecision is what an express controller decided at one step.
type ExpressDecision struct {
	// Renew replaces the express link with a fresh connection: the
	// dialing side connects one (OnRenew), the other asks it to with RENEW,
	// at most once per RenewGap.
	Renew bool
	// Hold sends this side's messages on the bulk links for this long
	// from now (HoldExpress; 0: no new hold).
	Hold time.Duration
	// Log: key-value pairs saying why, for the caller's log of a hold.
	Log []any
}

// StepExpress runs one step of the trunk's express controller
// (Config.ExpressControl) on the samples last returns, which reads the
// caller's latest TCP_INFO of a link, and carries out its decision, which
// it returns. Nothing happens without a controller, without a working
// express link or without a sample of it.
func (t *Trunk) StepExpress(now time.Time, last func(*Link) (tcpinfo.Info, bool)) ExpressDecision {
	t.mu.Lock()
	var x *Link
	if t.express >= 0 {
		x = t.links[t.express]
	}
	if x != nil && t.xCtl == nil && x.cfg.ExpressControl != nil {
		t.xCtl = x.cfg.ExpressControl()
	}
	ctl := t.xCtl
	t.mu.Unlock()
	if ctl == nil || x == nil || x.Retiring() {
		return ExpressDecision{}
	}
	in, ok := last(x)
	if !ok {
		return ExpressDecision{}
	}
	d := ctl.Step(now, ExpressSample{Info: in, Held: t.ExpressHeld(now), Bulk: func() []tcpinfo.Info { return t.bulkInfo(last) }})
	if d.Hold > 0 {
		t.HoldExpress(d.Hold)
	}
	if d.Renew {
		// Each side judges the window it sends with.
		if t.dialer {
			t.askRenew()
		} else {
			x.RequestRenew(RenewGap)
		}
	}
	return d
}

// bulkInfo is ExpressSample.Bulk: last's samples of the bulk links.
func (t *Trunk) bulkInfo(last func(*Link) (tcpinfo.Info, bool)) []tcpinfo.Info {
	t.mu.Lock()
	bulk := make([]*Link, 0, len(t.links))
	for i, l := range t.links {
		if l != nil && i != t.express {
			bulk = append(bulk, l)
		}
	}
	t.mu.Unlock()
	var ins []tcpinfo.Info
	for _, l := range bulk {
		if in, ok := last(l); ok {
			ins = append(ins, in)
		}
	}
	return ins
}
