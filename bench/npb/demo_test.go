package npb

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// demoOf runs the fake lab once per demo condition: the lossy and shared
// WANs slow direct runs more than gateway runs, as measured.
func demoOf(t *testing.T, failLossyCG bool) *Demo {
	t.Helper()
	d := &Demo{}
	rate := 0.0
	for i, cond := range DemoConditions {
		lab := &fakeLab{base: map[string]float64{"bt": 4, "cg": 2},
			speed: map[string]float64{"direct": 1 + float64(i), "gateways": 1.05}, cross: 1}
		if failLossyCG && cond.Name == "lossy" {
			lab.fail = func(j Job, _ int) (string, error, bool) {
				if j.Workload == "cg" && j.Mode.Kind == KindGateways {
					return "", &LabStalled{Packets: 3}, true
				}
				return "", nil, false
			}
		}
		c := Config{Workloads: []string{"bt", "cg"}, Modes: testModes, Reps: 1, Cross: []bool{cond.Cross},
			Ranks: 4, Scale: 0.5, PinWork: true, WorkRate: rate}
		samples, err := Run(context.Background(), c, lab, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rate == 0 {
			rate = WorkRate(samples)
		} else {
			for _, j := range lab.jobs {
				if !strings.Contains(strings.Join(j.Args, " "), "--loops-per-us 512.500") {
					t.Errorf("%s: run without the first condition's work rate: %v", cond.Name, j.Args)
				}
			}
		}
		h := Header{Date: "2026-12-02T10:00:00Z", Commit: "0123456789ab", Ranks: 4, Cores: 2, Scale: 0.5, Reps: 1,
			Setup: "RTT 20ms, WAN 200 Mbit/s, loss " + LossWords(strconv.FormatFloat(cond.Loss, 'g', -1, 64)) + ", hosts' TCP cubic",
			Lab:   "lab x: loss " + strconv.FormatFloat(cond.Loss, 'g', -1, 64)}
		d.Conditions = append(d.Conditions, cond)
		d.Reports = append(d.Reports, NewReport(h, testModes, samples))
	}
	return d
}

func TestDemoTable(t *testing.T) {
	d := demoOf(t, false)
	var b bytes.Buffer
	d.WriteTable(&b)
	out := b.String()
	lines := strings.Split(out, "\n")
	var groups, header, bt string
	for _, l := range lines {
		switch {
		case strings.Contains(l, "idle WAN") && strings.Contains(l, "|"):
			groups = l
		case strings.HasPrefix(l, "workload"):
			header = l
		case strings.HasPrefix(l, "bt "):
			bt = l
		}
	}
	for _, c := range DemoConditions {
		if !strings.Contains(groups, c.Label) {
			t.Errorf("no column group %q:\n%s", c.Label, out)
		}
		if !strings.Contains(out, "# "+c.Label+":") {
			t.Errorf("the header does not describe %q:\n%s", c.Label, out)
		}
	}
	if strings.Count(header, "gw/direct") != 3 || strings.Count(header, "gw CPU") != 3 || strings.Count(bt, "|") != 3 {
		t.Errorf("want 3 column groups of direct_s, gw/direct, gw CPU:\n%s", out)
	}
	// idle: 1.05/1; lossy: 1.05/2; shared: 1.05/3 (the fake drifts 1 % a
	// run, so 1.06 at first). Gateways: 0.1 s of CPU
	// per second of the run each, two of them, over 2 cores: 10 %.
	f := strings.Fields(strings.ReplaceAll(bt, "|", " "))
	if len(f) != 1+3*4 || f[2] != "1.06" || f[6] != "0.53" || f[10] != "0.35" || f[4] != "10%" {
		t.Errorf("bt row %q (fields %q)", bt, f)
	}
	if strings.Contains(out, "FAILED") || d.Failed() {
		t.Errorf("no cell failed:\n%s", out)
	}
	if !strings.Contains(out, "commit 0123456789ab") {
		t.Errorf("no commit:\n%s", out)
	}

	d = demoOf(t, true)
	b.Reset()
	d.WriteTable(&b)
	if !d.Failed() || !strings.Contains(b.String(), "FAILED: cg, 0.1 % random loss, through the gateways: lab stalled") {
		t.Errorf("a failed cell must show and fail the demo:\n%s", b.String())
	}
}

func TestDemoFigureAndRedraw(t *testing.T) {
	d := demoOf(t, true)
	dir := t.TempDir()
	p, err := d.WriteFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadDemo(p)
	if err != nil || len(back.Reports) != 3 || !back.Failed() {
		t.Fatalf("demo.json round trip: %v", err)
	}
	figs, err := back.DrawFigure(dir)
	if err != nil || len(figs) != 2 {
		t.Fatalf("figure: %v %v", figs, err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "demo.svg"))
	if err != nil {
		t.Fatal(err)
	}
	text := svgText(string(svg))
	for _, want := range []string{"idle WAN (n=1)", "0.1 % random loss (n=0-1)", "one CUBIC flow each way (n=1)",
		"RTT 20ms, WAN 200 Mbit/s, hosts' TCP cubic", "commit 0123456789ab", "n/a", "gateways' CPU"} {
		if !strings.Contains(text, want) {
			t.Errorf("demo figure: no %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "loss 0 %") {
		t.Errorf("the heading gives the idle lab's loss as the set-up of all:\n%s", text)
	}
	if dst := os.Getenv("NPB_FIGURE_DIR"); dst != "" {
		for _, f := range figs {
			b, _ := os.ReadFile(f)
			_ = os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644)
		}
	}
	if err := os.WriteFile(p, []byte(`{"conditions":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadDemo(p); err == nil || !strings.Contains(err.Error(), "not a demo.json") {
		t.Errorf("an empty demo.json: %v", err)
	}
}

// A run the lab stalled during runs again when StallRetries allows, says
// so, and fails as before when it stalls again or retries are off.
func TestStallRetries(t *testing.T) {
	for _, c := range []struct {
		retries, stalls int
		ok              bool
	}{{0, 1, false}, {1, 1, true}, {1, 2, false}} {
		calls := 0
		lab := &fakeLab{base: map[string]float64{"bt": 1}, speed: map[string]float64{"direct": 1, "gateways": 1}}
		lab.fail = func(j Job, _ int) (string, error, bool) {
			if j.Mode.Kind == KindGateways {
				if calls++; calls <= c.stalls {
					return "", &LabStalled{Packets: 2}, true
				}
			}
			return "", nil, false
		}
		cfg := Config{Workloads: []string{"bt"}, Modes: testModes, Reps: 1, Cross: []bool{false}, Ranks: 4, Scale: 1,
			StallRetries: c.retries}
		var progress bytes.Buffer
		samples, err := Run(context.Background(), cfg, lab, &progress)
		if err != nil {
			t.Fatal(err)
		}
		gw := samples[1]
		if gw.OK() != c.ok || len(samples) != 2 {
			t.Errorf("%+v: gateway sample %+v", c, gw)
		}
		if want := min(c.stalls, c.retries) + 2; strings.Count(progress.String(), "\n") != want {
			t.Errorf("%+v: want %d progress lines:\n%s", c, want, progress.String())
		}
		if c.retries > 0 && !strings.Contains(gw.Note, RerunNote) {
			t.Errorf("%+v: note %q", c, gw.Note)
		}
		d := &Demo{Conditions: DemoConditions[:1], Reports: []*Report{NewReport(Header{Cores: 2}, testModes, samples)}}
		var b bytes.Buffer
		d.WriteTable(&b)
		if (c.retries > 0) != strings.Contains(b.String(), "1 run(s) ran again after a lab stall") || d.Failed() == c.ok {
			t.Errorf("%+v: table\n%s", c, b.String())
		}
	}
}
