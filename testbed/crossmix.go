package testbed

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Patterns of a competing flow.
const (
	// PatternBulk is one iperf3 flow sending for the whole duration.
	PatternBulk = "bulk"
	// PatternOnOff is a series of transfers, each on a new connection,
	// with Pareto sizes and exponential pauses between them: short flows
	// that mostly live in slow start, and now and then a long one.
	PatternOnOff = "onoff"
)

// Defaults of the on/off pattern.
const (
	DefaultMeanSize = 2 << 20
	DefaultMeanGap  = 200 * time.Millisecond
	DefaultShape    = 1.5
	MaxCrossFlows   = 64
)

// CrossMix is the competing traffic of one Cross call: Flows flows, flow
// i with congestion control CC[i] and pattern Pattern[i] (a list of one
// applies to every flow).
type CrossMix struct {
	Flows    int           // 1..MaxCrossFlows; 0: as many as the longest list, else 1
	CC       []string      // congestion control per flow; none: the hosts' default
	Pattern  []string      // PatternBulk (default) or PatternOnOff per flow
	MeanSize int           // on/off: mean transfer size in bytes (DefaultMeanSize)
	MeanGap  time.Duration // on/off: mean pause between transfers (DefaultMeanGap)
	Shape    float64       // on/off: Pareto shape, > 1 (DefaultShape); smaller is heavier-tailed
	Seed     uint64        // on/off: seeds sizes and pauses; 0 picks one (Normalize)
	Duration time.Duration // how long the flows run, at least 1 s
}

// ParseCrossList splits a comma-separated --cc or --pattern value.
func ParseCrossList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	out := strings.Split(s, ",")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// Normalize fills the defaults and checks every field; errors name the
// flag of `mpi5k lab cross` and the fix.
func (m *CrossMix) Normalize() error {
	if m.Flows == 0 {
		m.Flows = max(1, len(m.CC), len(m.Pattern))
	}
	if m.Flows < 1 || m.Flows > MaxCrossFlows {
		return fmt.Errorf("--flows: need 1..%d, got %d", MaxCrossFlows, m.Flows)
	}
	if err := checkPerFlow("cc", m.CC, m.Flows); err != nil {
		return err
	}
	for _, cc := range m.CC {
		if !ccNameRE.MatchString(cc) {
			return fmt.Errorf("--cc: bad congestion control name %q (want e.g. cubic,bbr)", cc)
		}
	}
	if err := checkPerFlow("pattern", m.Pattern, m.Flows); err != nil {
		return err
	}
	onoff := false
	for _, p := range m.Pattern {
		switch p {
		case PatternBulk:
		case PatternOnOff:
			onoff = true
		default:
			return fmt.Errorf("--pattern: unknown pattern %q (want bulk or onoff, or a list such as bulk,onoff)", p)
		}
	}
	if m.Duration < time.Second {
		return fmt.Errorf("--duration: at least 1s, got %v", m.Duration)
	}
	if !onoff {
		return nil
	}
	if m.MeanSize == 0 {
		m.MeanSize = DefaultMeanSize
	}
	if m.MeanSize < 1<<10 || m.MeanSize > 1<<30 {
		return fmt.Errorf("--mean-size: %d bytes out of range 1KiB..1GiB", m.MeanSize)
	}
	if m.MeanGap == 0 {
		m.MeanGap = DefaultMeanGap
	}
	if m.MeanGap < time.Millisecond || m.MeanGap > time.Minute {
		return fmt.Errorf("--mean-gap: %v out of range 1ms..1m", m.MeanGap)
	}
	if m.Shape == 0 {
		m.Shape = DefaultShape
	}
	if !(m.Shape > 1 && m.Shape <= 10) {
		return fmt.Errorf("--shape: Pareto shape %g out of range (1, 10]: at 1 or below the mean size is infinite", m.Shape)
	}
	if m.Seed == 0 {
		m.Seed = uint64(time.Now().UnixNano()) | 1
	}
	return nil
}

func checkPerFlow(flag string, list []string, flows int) error {
	for _, v := range list {
		if v == "" {
			return fmt.Errorf("--%s: empty entry in the list (want e.g. --%s a,b)", flag, flag)
		}
	}
	if len(list) > 1 && len(list) != flows {
		return fmt.Errorf("--%s: %d values for %d flows: give one (for every flow) or one per flow (or set --flows %d)",
			flag, len(list), flows, len(list))
	}
	return nil
}

// FlowCC is flow i's congestion control ("" for the hosts' default).
func (m *CrossMix) FlowCC(i int) string { return perFlow(m.CC, i, "") }

// FlowPattern is flow i's pattern.
func (m *CrossMix) FlowPattern(i int) string { return perFlow(m.Pattern, i, PatternBulk) }

func perFlow(list []string, i int, def string) string {
	switch {
	case len(list) == 0:
		return def
	case len(list) == 1:
		return list[0]
	}
	return list[i]
}

// String describes the mix in one line, e.g. "2 flows: cubic bulk, bbr onoff
// (mean 2 MiB, gaps 200ms, shape 1.5, seed 7)".
func (m *CrossMix) String() string {
	parts := make([]string, m.Flows)
	onoff := false
	for i := range parts {
		cc := m.FlowCC(i)
		if cc == "" {
			cc = "default-cc"
		}
		parts[i] = cc + " " + m.FlowPattern(i)
		onoff = onoff || m.FlowPattern(i) == PatternOnOff
	}
	s := fmt.Sprintf("%d flow(s): %s", m.Flows, strings.Join(parts, ", "))
	if onoff {
		seed := "seeds picked per run"
		if m.Seed != 0 {
			seed = fmt.Sprintf("seed %d", m.Seed)
		}
		s += fmt.Sprintf(" (on/off: Pareto sizes mean %d B shape %g, exponential gaps mean %v, %s)", m.MeanSize, m.Shape, m.MeanGap, seed)
	}
	return s
}

// onOffDraw draws the transfer sizes and pauses of an on/off flow from its
// own xorshift generator.
type onOffDraw struct {
	rng   xorshift
	xm    float64 // Pareto scale: mean = xm·shape/(shape-1)
	shape float64
	max   float64
	gap   float64 // mean pause, seconds
}

func newOnOffDraw(seed uint64, meanSize int, shape float64, gap time.Duration) *onOffDraw {
	return &onOffDraw{rng: newXorshift(seed), xm: float64(meanSize) * (shape - 1) / shape, shape: shape,
		max: 1000 * float64(meanSize), gap: gap.Seconds()}
}

// size is a Pareto draw, capped at 1000 means so one transfer cannot
// outlast any run.
func (d *onOffDraw) size() int {
	s := d.xm / math.Pow(d.rng.unit(), 1/d.shape)
	return int(min(max(s, 1), d.max))
}

// pause is an exponential draw.
func (d *onOffDraw) pause() time.Duration {
	return time.Duration(-math.Log(d.rng.unit()) * d.gap * float64(time.Second))
}

// xorshift is xorshift64* (as the emulator's choices).
type xorshift uint64

func newXorshift(seed uint64) xorshift {
	// splitmix64 of the seed: neighbouring seeds (one per flow) start far
	// apart, and the state is never 0.
	z := seed + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	if z == 0 {
		z = 1
	}
	return xorshift(z)
}

// unit is uniform in (0, 1].
func (x *xorshift) unit() float64 {
	s := uint64(*x)
	s ^= s >> 12
	s ^= s << 25
	s ^= s >> 27
	*x = xorshift(s)
	return float64((s*2685821657736338717)>>11+1) / (1 << 53)
}
