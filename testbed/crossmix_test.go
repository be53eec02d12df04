package testbed

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCrossMixNormalize(t *testing.T) {
	m := CrossMix{CC: ParseCrossList("cubic, bbr"), Duration: 10 * time.Second}
	if err := m.Normalize(); err != nil {
		t.Fatal(err)
	}
	if m.Flows != 2 || m.FlowCC(0) != "cubic" || m.FlowCC(1) != "bbr" || m.FlowPattern(1) != PatternBulk {
		t.Errorf("--cc cubic,bbr: %d flows, %s %s / %s %s", m.Flows, m.FlowCC(0), m.FlowPattern(0), m.FlowCC(1), m.FlowPattern(1))
	}
	if m.Seed != 0 || m.MeanSize != 0 {
		t.Errorf("bulk-only mix got on/off defaults: %+v", m)
	}
	// One value applies to every flow.
	m = CrossMix{Flows: 3, CC: []string{"cubic"}, Pattern: []string{"onoff"}, Duration: time.Second}
	if err := m.Normalize(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if m.FlowCC(i) != "cubic" || m.FlowPattern(i) != PatternOnOff {
			t.Errorf("flow %d: %s %s", i, m.FlowCC(i), m.FlowPattern(i))
		}
	}
	if m.MeanSize != DefaultMeanSize || m.MeanGap != DefaultMeanGap || m.Shape != DefaultShape || m.Seed == 0 {
		t.Errorf("on/off defaults not filled: %+v", m)
	}
	if s := m.String(); !strings.Contains(s, "3 flow(s): cubic onoff, cubic onoff, cubic onoff") || !strings.Contains(s, "seed") {
		t.Errorf("String: %s", s)
	}
	// Plain Cross: one bulk flow with the hosts' default.
	m = CrossMix{Duration: time.Minute}
	if err := m.Normalize(); err != nil || m.Flows != 1 || m.FlowCC(0) != "" || m.FlowPattern(0) != PatternBulk {
		t.Errorf("empty mix: %+v, %v", m, err)
	}
}

func TestCrossMixErrors(t *testing.T) {
	on := []string{PatternOnOff}
	for _, c := range []struct {
		m    CrossMix
		want string
	}{
		{CrossMix{Flows: 65}, "--flows: need 1..64"},
		{CrossMix{Flows: -1}, "--flows"},
		{CrossMix{Flows: 2, CC: []string{"cubic", "bbr", "reno"}}, "--cc: 3 values for 2 flows"},
		{CrossMix{CC: []string{"cubic", ""}}, "--cc: empty entry"},
		{CrossMix{CC: []string{"Cubic!"}}, `--cc: bad congestion control name "Cubic!"`},
		{CrossMix{Flows: 3, Pattern: []string{"bulk", "onoff"}}, "--pattern: 2 values for 3 flows"},
		{CrossMix{Pattern: []string{"burst"}}, `--pattern: unknown pattern "burst"`},
		{CrossMix{Duration: 500 * time.Millisecond}, "--duration: at least 1s"},
		{CrossMix{Pattern: on, MeanSize: 100}, "--mean-size"},
		{CrossMix{Pattern: on, MeanSize: 2 << 30}, "--mean-size"},
		{CrossMix{Pattern: on, MeanGap: time.Microsecond}, "--mean-gap"},
		{CrossMix{Pattern: on, Shape: 1}, "--shape"},
		{CrossMix{Pattern: on, Shape: 0.5}, "--shape"},
		{CrossMix{Pattern: on, Shape: math.NaN()}, "--shape"},
	} {
		m := c.m
		if m.Duration == 0 {
			m.Duration = time.Second
		}
		err := m.Normalize()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.m, err, c.want)
		}
	}
	// The fix is named.
	m := CrossMix{Flows: 2, CC: []string{"a", "b", "c"}, Duration: time.Second}
	if err := m.Normalize(); err == nil || !strings.Contains(err.Error(), "--flows 3") {
		t.Errorf("count mismatch: %v", err)
	}
}

// The on/off draws repeat with the seed, differ between neighbouring seeds
// (one per flow), and have about the set means: Pareto sizes (a heavy tail:
// the largest draw is many times the mean) and exponential pauses.
func TestOnOffDraws(t *testing.T) {
	const n = 200000
	mean, gap := 1<<20, 100*time.Millisecond
	draw := func(seed uint64) ([]int, []time.Duration) {
		d := newOnOffDraw(seed, mean, 1.5, gap)
		s, p := make([]int, n), make([]time.Duration, n)
		for i := range s {
			s[i], p[i] = d.size(), d.pause()
		}
		return s, p
	}
	s1, p1 := draw(7)
	s1b, p1b := draw(7)
	if !slices.Equal(s1, s1b) || !slices.Equal(p1, p1b) {
		t.Fatal("the same seed drew different sizes or pauses")
	}
	s2, _ := draw(8)
	same := 0
	for i := range s1[:1000] {
		if s1[i] == s2[i] {
			same++
		}
	}
	if same > 10 {
		t.Errorf("seeds 7 and 8 share %d of 1000 sizes", same)
	}
	var sum, maxs float64
	xm := float64(mean) * 0.5 / 1.5
	for _, s := range s1 {
		if float64(s) < xm-1 {
			t.Fatalf("size %d below the Pareto scale %g", s, xm)
		}
		sum += float64(s)
		maxs = max(maxs, float64(s))
	}
	// Shape 1.5 has infinite variance: the sample mean converges slowly
	// and the cap at 1000 means trims it by ~3 %.
	if m := sum / n; m < 0.85*float64(mean) || m > 1.1*float64(mean) {
		t.Errorf("mean size %.0f, want about %d", m, mean)
	}
	if maxs < 50*float64(mean) || maxs > 1000*float64(mean) {
		t.Errorf("largest size %.0f: want a heavy tail up to the cap (1000 means)", maxs)
	}
	var psum time.Duration
	for _, p := range p1 {
		if p < 0 {
			t.Fatalf("negative pause %v", p)
		}
		psum += p
	}
	if m := psum / n; m < 98*time.Millisecond || m > 102*time.Millisecond {
		t.Errorf("mean pause %v, want about %v", m, gap)
	}
}
