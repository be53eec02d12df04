package npb

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"
)

// Legends name modes in plain words, never by their --gw-mode labels.
func TestModeLabel(t *testing.T) {
	for _, c := range []struct {
		m    Mode
		want string
	}{
		{Direct, "direct (no gateways)"},
		{Mode{Name: "gateways", Kind: KindGateways}, "through the gateways"},
		{Mode{Name: "socat-relay", Kind: KindRelay}, "plain relay chain (socat)"},
		{Mode{Name: "noexpress", Kind: KindGateways, Args: []string{"--wan-express=false"}}, "gateways without express link"},
		{Mode{Name: "prio10", Kind: KindGateways, Args: []string{"--priority", "-10"}}, "gateways at nice -10"},
		{Mode{Name: "k4nx", Kind: KindGateways, Args: []string{"--wan-conns", "4", "--wan-express=false"}},
			"gateways, 4 bulk WAN connections, without express link"},
		{Mode{Name: "gw-cubic-bbr", Kind: KindGateways, LANCC: "cubic", WANCC: "bbr"}, "gateways, LAN TCP cubic, WAN TCP bbr"},
		{Mode{Name: "nq", Kind: KindGateways, Args: []string{"--wan-queue", "0"}}, "gateways without queue control"},
		{Mode{Name: "floor", Kind: KindGateways, Args: []string{"--gateway-bin", "bin/bench/floorgw", "--wan-plaintext"}},
			"gateways, plain relay pair (floorgw)"},
		{Mode{Name: "odd", Kind: KindGateways, Args: []string{"--frob=3"}}, "gateways, --frob=3"},
		{Mode{Name: "one", Kind: KindGateways, WANConns: 1}, "gateways, 1 bulk WAN connection"},
	} {
		if got := ModeLabel(c.m); got != c.want {
			t.Errorf("%s %v: %q, want %q", c.m.Name, c.m.Args, got, c.want)
		}
	}
}

// A figure's title line gives the set-up and the commit, also for reports
// written before they were recorded apart.
func TestFigureLine(t *testing.T) {
	old := Header{Date: "2026-11-27T01:40:31Z", Version: "897bdb2", Ranks: 4, Cores: 2,
		Lab: "lab rn: 2 sites x 2 nodes, RTT 20ms, WAN 200 Mbit/s per direction, queue 500000 B, loss 0.001, MTU 1500, host TCP reno, competing traffic 1 iperf3 flow(s) per direction"}
	if got, want := old.FigureLine(), "RTT 20ms, WAN 200 Mbit/s, loss 0.1 %, hosts' TCP reno; 4 ranks on 2 cores; commit 897bdb2, 2026-11-27"; got != want {
		t.Errorf("old header: %q, want %q", got, want)
	}
	h := Header{Setup: "RTT 5ms, WAN 1000 Mbit/s, loss 0 %, hosts' TCP cubic", Version: "v0.3.0-dev+0123456789ab", Commit: "abcdefabcdef"}
	if got := h.FigureLine(); got != "RTT 5ms, WAN 1000 Mbit/s, loss 0 %, hosts' TCP cubic; commit abcdefabcdef" {
		t.Errorf("new header: %q", got)
	}
	h.Commit = ""
	if got := h.CommitLabel(); got != "0123456789ab" {
		t.Errorf("commit from version: %q", got)
	}
	if got := (Header{}).FigureLine(); got != "set-up not recorded; commit unknown" {
		t.Errorf("empty header: %q", got)
	}
}

// drawn runs a plan on the fake lab and draws its figures, returning the
// SVGs' text by base name.
func drawn(t *testing.T, modes []Mode, h Header) (*Report, map[string]string) {
	t.Helper()
	lab := &fakeLab{base: map[string]float64{"bt": 4, "cg": 2, "pingpong": 0.5},
		speed: map[string]float64{"direct": 1, "gateways": 0.8, "noexpress": 0.9}, cross: 1.5}
	c := Config{Workloads: []string{"pingpong", "bt", "cg"}, Modes: modes, Reps: 3, Cross: []bool{false, true}, Ranks: 4, Scale: 1}
	samples, err := Run(context.Background(), c, lab, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReport(h, modes, samples)
	dir := t.TempDir()
	figs, err := rep.DrawFigures(dir)
	if err != nil {
		t.Fatal(err)
	}
	svgs := map[string]string{}
	for _, f := range figs {
		if strings.HasSuffix(f, ".svg") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			svgs[strings.TrimSuffix(filepath.Base(f), ".svg")] = string(b)
		}
	}
	return rep, svgs
}

// svgText is the text an SVG draws, its glyphs' strings joined.
func svgText(svg string) string {
	var b strings.Builder
	for _, part := range strings.Split(svg, "<text")[1:] {
		if i := strings.Index(part, ">"); i >= 0 {
			if j := strings.Index(part[i:], "</text>"); j >= 0 {
				b.WriteString(part[i+1 : i+j])
				b.WriteByte('\n')
			}
		}
	}
	return strings.NewReplacer("&#39;", "'", "&amp;", "&").Replace(b.String())
}

func TestFiguresSayWhatTheyShow(t *testing.T) {
	modes := []Mode{Direct, {Name: "gateways", Kind: KindGateways}, {Name: "noexpress", Kind: KindGateways, Args: []string{"--wan-express=false"}}}
	h := Header{Date: "2026-12-02T10:00:00Z", Commit: "0123456789ab", Ranks: 4, Cores: 2, Compute: "work",
		Setup: "RTT 20ms, WAN 200 Mbit/s, loss 0 %, hosts' TCP cubic"}
	_, svgs := drawn(t, modes, h)
	bars, ping := svgText(svgs["bars"]), svgText(svgs["pingpong"])
	if bars == "" || ping == "" {
		t.Fatalf("figures missing: %v", svgs)
	}
	for name, text := range map[string]string{"bars": bars, "pingpong": ping} {
		for _, want := range []string{"RTT 20ms, WAN 200 Mbit/s", "hosts' TCP cubic", "commit 0123456789ab", "2026-12-02",
			"direct (no gateways) (n=3)", "through the gateways (n=3)", "gateways without express link (n=3)"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: no %q in\n%s", name, want, text)
			}
		}
		for _, internal := range []string{">noexpress<", "\nnoexpress\n", "\ngateways\n"} {
			if strings.Contains("\n"+text, internal) {
				t.Errorf("%s: an internal mode name %q as a legend", name, internal)
			}
		}
	}
	for _, want := range []string{"latency (ms, log scale)", "message size (bytes, log scale)"} {
		if !strings.Contains(ping, want) {
			t.Errorf("pingpong: no axis label %q", want)
		}
	}
	if !strings.Contains(bars, "marks: every run") {
		t.Errorf("bars do not say the marks are the runs:\n%s", bars)
	}
	// The ping-pong's latency ticks are in ms: the fake's 20 us is 0.02.
	if !strings.Contains(ping, "\n0.02\n") || strings.Contains(ping, "\n20\n") {
		t.Errorf("latency ticks not in ms:\n%s", ping)
	}
}

// Every series gets a marker shape besides its colour, and no two
// neighbouring series share either.
func TestSeriesHaveShapes(t *testing.T) {
	for i := 0; i+1 < len(palette); i++ {
		if modeColor(i) == modeColor(i+1) || modeShape(i) == modeShape(i+1) {
			t.Errorf("series %d and %d share a colour or a shape", i, i+1)
		}
	}
	// No red against green: Okabe-Ito's first two are blue and orange.
	r0, g0, b0, _ := modeColor(0).RGBA()
	r1, g1, b1, _ := modeColor(1).RGBA()
	if !(b0 > r0 && b0 > g0) || !(r1 > b1 && g1 > b1) {
		t.Errorf("first two colours %v %v: want blue and orange", modeColor(0), modeColor(1))
	}
}

// The ping-pong summary keeps the repetitions' spread for the error bars.
func TestPingSpread(t *testing.T) {
	rep, _ := drawn(t, testModes, Header{})
	for _, p := range rep.PingPong {
		if p.N != 3 || p.LatMedLoUs <= 0 || p.LatMedLoUs > p.LatMedUs || p.LatMedHiUs < p.LatMedUs ||
			p.BWLoMBps > p.BWMBps || p.BWHiMBps < p.BWMBps {
			t.Errorf("spread of %+v", p)
		}
	}
}

// A heading too wide for its figure breaks at "; ", never inside a part.
func TestWrapHeading(t *testing.T) {
	width := func(s string) vg.Length { return vg.Length(len(s)) }
	h := "RTT 20ms, WAN 200 Mbit/s; 4 ranks on 2 cores; commit abc, 2026-12-02"
	if got := wrapHeading(h, width, 200); got != h {
		t.Errorf("wide enough: %q", got)
	}
	if got, want := wrapHeading(h, width, 45), "RTT 20ms, WAN 200 Mbit/s; 4 ranks on 2 cores;\ncommit abc, 2026-12-02"; got != want {
		t.Errorf("narrow: %q, want %q", got, want)
	}
	if got := wrapHeading(h, width, 5); strings.Count(got, "\n") != 2 {
		t.Errorf("narrower than every part: %q", got)
	}
}

// A ratio axis is labelled often enough to read a bar's value off it.
func TestRatioTicks(t *testing.T) {
	var labels []string
	for _, tk := range (ratioTicks{}).Ticks(0, 1.6) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "0 0.25 0.5 0.75 1 1.25 1.5" {
		t.Errorf("0..1.6: %q", got)
	}
	labels = nil
	for _, tk := range (ratioTicks{}).Ticks(0, 3.2) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "0 0.5 1 1.5 2 2.5 3" {
		t.Errorf("0..3.2: %q", got)
	}
}
