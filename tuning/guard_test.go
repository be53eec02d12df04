package tuning

import (
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/tcpinfo"
)

// fakeHold records the holds asked for: their ends, and when the first of
// each series of calls (a hold and its extensions) came.
type fakeHold struct {
	now          *time.Time
	until, start []time.Time
}

func (f *fakeHold) Hold(until time.Time) {
	if n := len(f.until); n == 0 || f.now.After(f.until[n-1]) {
		f.until, f.start = append(f.until, until), append(f.start, *f.now)
		return
	}
	f.until[len(f.until)-1] = until // an extension
}

// draining is a link carrying a 1 MB flight (2 BDP at 200 Mbit/s, 20 ms)
// that empties 45 ms into a hold.
func (s *guardSim) draining(at time.Time) uint32 {
	if n := len(s.h.until); n > 0 && !at.Before(s.h.start[n-1].Add(45*time.Millisecond)) && at.Before(s.h.until[n-1]) {
		return 0
	}
	return 700
}

// guardRun feeds a guard samples every guardEvery from t0 to t0+d: the
// socket has inflight(t) segments in flight, BBR's min_rtt is minRTT(t),
// and probe(t) says whether BBR is in PROBE_RTT.
type guardSim struct {
	gl       guardLink
	h        fakeHold
	t        time.Time
	inflight func(time.Time) uint32
	minRTT   func(time.Time) time.Duration
	probe    func(time.Time) bool
	bw       uint64 // BBR's bandwidth estimate (0: 25 MB/s, 200 Mbit/s)
	msgs     func(time.Time) bool
}

func (s *guardSim) run(d time.Duration) {
	s.h.now = &s.t
	for end := s.t.Add(d); s.t.Before(end); s.t = s.t.Add(guardEvery) {
		in := tcpinfo.Info{Unacked: s.inflight(s.t), SndMSS: 1448}
		bw := s.bw
		if bw == 0 {
			bw = 25e6
		}
		b := tcpinfo.BBR{Bandwidth: bw, MinRTT: s.minRTT(s.t), PacingGain: 1, CwndGain: 2}
		if s.probe != nil && s.probe(s.t) {
			b.CwndGain = 1
		}
		s.gl.step(&s.h, s.t, &in, &b, s.msgs != nil && s.msgs(s.t))
	}
}

// TestGuardHolds: a busy BBR link whose min_rtt was restamped at a known
// time is held once, ending after the latest expiry less a min RTT and
// starting early enough to drain; a restamp after the hold counts as a
// skip. An idle link, or one whose stamp is unknown, is not held.
func TestGuardHolds(t *testing.T) {
	t0 := time.Unix(5000, 0)
	const minRTT = 20 * time.Millisecond
	restamp := t0.Add(10*time.Second + 30*time.Millisecond) // the first ACK after the hold
	s := &guardSim{t: t0,
		minRTT: func(at time.Time) time.Duration {
			switch {
			case at.Before(t0.Add(20 * time.Millisecond)):
				return 21 * time.Millisecond
			case at.Before(restamp):
				return minRTT // stamped in (15, 20] ms
			}
			return minRTT + 150*time.Microsecond
		}}
	s.inflight = s.draining
	s.run(9 * time.Second)
	if len(s.h.until) != 0 {
		t.Fatalf("held %v before the expiry was near", s.h.until)
	}
	s.run(time.Second + 500*time.Millisecond)
	if len(s.h.until) != 1 || s.gl.holds != 1 {
		t.Fatalf("holds %v (counted %d), want one", s.h.until, s.gl.holds)
	}
	from := t0.Add(15*time.Millisecond + tcpinfoWindow)
	latest := t0.Add(20*time.Millisecond + tcpinfoWindow + 10*time.Millisecond)
	end := s.h.until[0]
	if want := latest.Add(guardMargin - minRTT); end.Before(want) {
		t.Errorf("hold ends at %v, before the latest expiry less a min RTT (%v)", end.Sub(t0), want.Sub(t0))
	}
	// The first new ACK comes a min RTT after the end: with the stamp known
	// to 5 ms, writing resumes before the filter can have expired.
	if end.After(from) {
		t.Errorf("hold ends at %v, after the earliest expiry %v", end.Sub(t0), from.Sub(t0))
	}
	if held := s.gl.held; !s.h.start[0].Equal(end.Add(-held)) {
		t.Errorf("hold time counted %v, the hold ran %v", held, end.Sub(s.h.start[0]))
	}
	// 1 MB drains at 25 MB/s in 40 ms plus half a min RTT for the last ACK.
	if lead := from.Sub(s.h.start[0]); lead < 50*time.Millisecond || lead > 100*time.Millisecond {
		t.Errorf("hold starts %v before the earliest expiry, want 50-100 ms for a 1 MB flight", lead)
	}
	if s.gl.skips != 1 {
		t.Errorf("skips %d after the restamp, want 1", s.gl.skips)
	}
	// The next expiry, 10 s after the restamp, is held too.
	s.run(10 * time.Second)
	if len(s.h.until) != 2 {
		t.Errorf("holds %d after the second expiry, want 2", len(s.h.until))
	}

	// An idle link (no more in flight than PROBE_RTT allows) is not held.
	idle := &guardSim{t: t0, inflight: func(time.Time) uint32 { return probeRTTCwnd }, minRTT: s.minRTT}
	idle.run(11 * time.Second)
	if len(idle.h.until) != 0 {
		t.Errorf("an idle link was held: %v", idle.h.until)
	}
	// While messages cross the site pair: no hold.
	busy := &guardSim{t: t0, inflight: func(time.Time) uint32 { return 700 }, minRTT: s.minRTT, msgs: func(time.Time) bool { return true }}
	busy.run(11 * time.Second)
	if len(busy.h.until) != 0 {
		t.Errorf("a link was held while messages crossed: %v", busy.h.until)
	}
	// Without a visible restamp the expiry is unknown: no hold.
	unknown := &guardSim{t: t0, inflight: func(time.Time) uint32 { return 700 }, minRTT: func(time.Time) time.Duration { return minRTT }}
	unknown.run(11 * time.Second)
	if len(unknown.h.until) != 0 {
		t.Errorf("a link with an unknown stamp was held: %v", unknown.h.until)
	}
}

// TestGuardMiss: a link that does not drain has its hold stretched up to
// the earliest expiry; a hold followed by PROBE_RTT anyway is not a skip,
// and the end of PROBE_RTT gives the next stamp.
func TestGuardMiss(t *testing.T) {
	t0 := time.Unix(5000, 0)
	dipAt := t0.Add(10*time.Second + 40*time.Millisecond)
	s := &guardSim{t: t0,
		inflight: func(time.Time) uint32 { return 700 },
		minRTT:   lowerAt20ms(t0),
		probe:    func(at time.Time) bool { return !at.Before(dipAt) && at.Before(dipAt.Add(250*time.Millisecond)) },
	}
	s.run(10*time.Second + 500*time.Millisecond)
	if s.gl.holds != 1 || s.gl.skips != 0 || len(s.h.until) != 1 {
		t.Fatalf("holds %d (%d asked) skips %d, want 1 and 0", s.gl.holds, len(s.h.until), s.gl.skips)
	}
	from := t0.Add(15*time.Millisecond + tcpinfoWindow)
	if end := s.h.until[0]; end.Before(from) || end.After(from.Add(2*guardEvery)) {
		t.Errorf("an undrained hold ends %v after the earliest expiry, want 0-%v", end.Sub(from), 2*guardEvery)
	}
	if f, _, ok := s.gl.stamp.Expiry(); !ok || f.Before(dipAt.Add(250*time.Millisecond+tcpinfoWindow-guardEvery)) {
		t.Errorf("after the dip the next expiry is %v (known %v), want 10 s after it ended", f.Sub(t0), ok)
	}
}

const tcpinfoWindow = tcpinfo.BBRMinRTTWindow

// lowerAt20ms is a min_rtt that drops from 21 to 20 ms 20 ms after t0
// (sampled every 5 ms: the stamp lies in (15, 20] ms).
func lowerAt20ms(t0 time.Time) func(time.Time) time.Duration {
	return func(at time.Time) time.Duration {
		if at.Before(t0.Add(20 * time.Millisecond)) {
			return 21 * time.Millisecond
		}
		return 20 * time.Millisecond
	}
}

// TestGuardNoLongHold: a link whose bandwidth estimate is far too low for
// its flight (it has sent only bursts) would need a hold longer than the
// dip it avoids; the guard never holds it.
func TestGuardNoLongHold(t *testing.T) {
	t0 := time.Unix(5000, 0)
	s := &guardSim{t: t0,
		inflight: func(time.Time) uint32 { return 700 },
		minRTT:   lowerAt20ms(t0),
		bw:       1e6, // 1 MB in flight drains in a second at this rate
	}
	s.run(11 * time.Second)
	if len(s.h.until) != 0 {
		t.Errorf("held a link whose flight needs a second to drain: until %v (now %v)", s.h.until[0].Sub(t0), s.h.start[0].Sub(t0))
	}
}
