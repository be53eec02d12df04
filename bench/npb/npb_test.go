package npb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFixtures(t *testing.T) {
	o, err := ParseOutput(bytes.NewReader(readFixture(t, "bt-openmpi.out")))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Results) != 1 {
		t.Fatalf("want 1 result, got %d", len(o.Results))
	}
	r := o.Results[0]
	if r.Workload != "bt" || r.MPI != "openmpi" || r.Ranks != 4 || r.Sites != 2 || !r.Verified ||
		r.Failures != 0 || r.TimeS <= 0 || r.Msgs == 0 || r.WANBytes == 0 || r.LoopsPerUs <= 0 {
		t.Errorf("bt result misread: %+v", r)
	}

	o, err = ParseOutput(bytes.NewReader(readFixture(t, "pingpong-openmpi.out")))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.PingPong) != 12 || o.PingPong[0].Size != 1 || o.PingPong[11].Size != 4<<20 {
		t.Fatalf("want 12 sizes 1..4 MiB, got %+v", o.PingPong)
	}
	for _, p := range o.PingPong {
		if p.LatMinUs <= 0 || p.LatMinUs > p.LatMedUs || p.BWMBps <= 0 {
			t.Errorf("implausible point %+v", p)
		}
	}

	o, err = ParseOutput(bytes.NewReader(readFixture(t, "ft-corrupt-openmpi.out")))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.VerifyErr) != 1 || !strings.Contains(o.VerifyErr[0], "workload=ft rank=2") ||
		len(o.Results) != 1 || o.Results[0].Verified || o.Results[0].Failures != 1 {
		t.Errorf("corrupt run misread: %+v", o)
	}
	o, err = ParseOutput(bytes.NewReader(readFixture(t, "is-mpich.out")))
	if err != nil || len(o.Results) != 1 || o.Results[0].MPI != "mpich" {
		t.Errorf("mpich is run misread: %+v %v", o, err)
	}
}

func TestParseErrors(t *testing.T) {
	good := "workload=bt mpi=openmpi ranks=4 sites=2 time_s=1.5 compute_s=1 bytes=10 msgs=1 " +
		"wan_bytes=10 wan_msgs=1 failures=0 loops_per_us=3 verified=yes"
	if _, err := ParseResult(good); err != nil {
		t.Fatalf("good line rejected: %v", err)
	}
	for name, line := range map[string]string{
		"missing field": strings.Replace(good, "time_s=1.5 ", "", 1),
		"bad number":    strings.Replace(good, "time_s=1.5", "time_s=fast", 1),
		"negative":      strings.Replace(good, "time_s=1.5", "time_s=-1", 1),
		"bad verified":  strings.Replace(good, "verified=yes", "verified=maybe", 1),
		"not key=value": good + " garbage",
		"bad count":     strings.Replace(good, "msgs=1", "msgs=-1", 1),
	} {
		if _, err := ParseResult(line); err == nil {
			t.Errorf("%s: accepted %q", name, line)
		}
	}
	_, err := ParseOutput(strings.NewReader("hello\nMPI5K-RESULT workload=bt\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("want an error naming line 2, got %v", err)
	}
}

// fakeLab answers like mpi5k-workload would, with times set per mode and
// per traffic setting, and failures injected on demand.
type fakeLab struct {
	base  map[string]float64 // workload -> direct time
	speed map[string]float64 // mode -> factor on the direct time
	cross float64            // factor with competing traffic
	fail  func(j Job, call int) (out string, err error, handled bool)
	jobs  []Job
}

func (f *fakeLab) Run(_ context.Context, j Job) ([]byte, error) {
	f.jobs = append(f.jobs, j)
	if f.fail != nil {
		if out, err, ok := f.fail(j, len(f.jobs)); ok {
			return []byte(out), err
		}
	}
	t := f.base[j.Workload] * f.speed[j.Mode.Name]
	if j.Cross {
		t *= f.cross
	}
	// A little drift between repetitions so min and median differ.
	t *= 1 + 0.01*float64(len(f.jobs)%3)
	var b strings.Builder
	fmt.Fprintf(&b, "mpi5k-workload %s: human line\n", j.Workload)
	if j.Workload == "pingpong" {
		for _, s := range []int{1, 1024, 1 << 20} {
			lat := (20.0 + float64(s)/1000) * f.speed[j.Mode.Name]
			fmt.Fprintf(&b, "MPI5K-PINGPONG size=%d reps=5 lat_us_min=%.3f lat_us_med=%.3f bw_MBps=%.3f\n",
				s, lat*0.9, lat, float64(s)/lat)
		}
	}
	fmt.Fprintf(&b, "MPI5K-RESULT workload=%s mpi=openmpi ranks=%d sites=2 scale=1 compute_scale=1 "+
		"size_scale=1 compute=work time_s=%.6f compute_s=0.5 bytes=100 msgs=2 wan_bytes=100 wan_msgs=2 "+
		"failures=0 loops_per_us=512.5 verified=yes\n", j.Workload, j.Ranks, t)
	if j.Mode.Kind == KindGateways {
		// mpi5k run's summary: each gateway spends 0.1 s of CPU per second
		// of the run and forwards 512 MiB.
		b.WriteString("mpi5k: gateway summary\n")
		for _, site := range []string{"a", "b"} {
			fmt.Fprintf(&b, "  MPI5K-GATEWAY site=%s cpu_s=%.3f wan_bytes=%d cpu_total_s=%.3f\n", site, 0.1*t, 512<<20, 0.1*t+0.2)
		}
	}
	return []byte(b.String()), nil
}

var testModes = []Mode{Direct, {Name: "gateways", Kind: KindGateways}}

func TestPlanInterleaves(t *testing.T) {
	c := Config{Workloads: []string{"bt", "cg"}, Modes: testModes, Reps: 2, Cross: []bool{false, true},
		Ranks: 4, Scale: 1}
	plan := c.Plan()
	if len(plan) != 2*2*2*2 {
		t.Fatalf("want 16 cells, got %d", len(plan))
	}
	c.Workloads = append(c.Workloads, "pingpong")
	for _, cell := range c.Plan() {
		if cell.Workload == "pingpong" && cell.Cross {
			t.Fatalf("ping-pong planned with competing traffic: %+v", cell)
		}
	}
	plan = plan[:0]
	for _, cell := range c.Plan() {
		if cell.Workload != "pingpong" {
			plan = append(plan, cell)
		}
	}
	for i := 0; i < len(plan); i += 2 {
		a, b := plan[i], plan[i+1]
		if a.Mode != "direct" || b.Mode != "gateways" || a.Workload != b.Workload || a.Rep != b.Rep || a.Cross != b.Cross {
			t.Fatalf("cells %d,%d not an A B pair: %+v %+v", i, i+1, a, b)
		}
	}
	if plan[0].Rep != 0 || plan[len(plan)-1].Rep != 1 {
		t.Errorf("repetitions must be outermost: %+v", plan)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Workloads: []string{"bt"}, Modes: testModes, Reps: 1, Cross: []bool{false}, Ranks: 4, Scale: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(c *Config){
		"workload":  func(c *Config) { c.Workloads = []string{"xx"} },
		"reps":      func(c *Config) { c.Reps = 0 },
		"modes dup": func(c *Config) { c.Modes = []Mode{Direct, Direct} },
		"mode kind": func(c *Config) { c.Modes = []Mode{{Name: "x", Kind: "teleport"}} },
		"cross":     func(c *Config) { c.Cross = nil },
		"ranks":     func(c *Config) { c.Ranks = 1 },
		"scale":     func(c *Config) { c.Scale = 0 },
		"size":      func(c *Config) { c.Size = "B" },
	}
	for name, mut := range bad {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
}

func TestRunAggregatesAndMarksFailures(t *testing.T) {
	lab := &fakeLab{
		base:  map[string]float64{"bt": 4, "cg": 2, "ft": 5, "pingpong": 0.5},
		speed: map[string]float64{"direct": 1, "gateways": 0.8},
		cross: 1.5,
	}
	cgFails := 0
	lab.fail = func(j Job, call int) (string, error, bool) {
		switch {
		case j.Workload == "ft" && j.Mode.Name == "gateways":
			// Every ft run through the gateways fails verification.
			return "VERIFICATION FAILED workload=ft rank=2 src=0 iter=0 msg=0 bytes=8 offset=0\n" +
				"MPI5K-RESULT workload=ft mpi=openmpi ranks=4 sites=2 time_s=1 compute_s=0 bytes=1 msgs=1 " +
				"wan_bytes=1 wan_msgs=1 failures=1 loops_per_us=1 verified=no\n", errors.New("exit status 1"), true
		case j.Workload == "cg" && j.Mode.Name == "direct" && j.Cross && cgFails == 0:
			cgFails++ // only the first repetition
			return "mpirun: lab is not up\n", errors.New("exit status 1"), true
		}
		return "", nil, false
	}
	c := Config{Workloads: []string{"pingpong", "bt", "cg", "ft"}, Modes: testModes, Reps: 3,
		Cross: []bool{false, true}, Ranks: 4, Scale: 1, PinWork: true}
	var progress bytes.Buffer
	samples, err := Run(context.Background(), c, lab, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != len(c.Plan()) || strings.Count(progress.String(), "\n") != len(samples) {
		t.Fatalf("%d samples, %d progress lines, plan %d", len(samples),
			strings.Count(progress.String(), "\n"), len(c.Plan()))
	}
	// Work pinned after the first successful non-ping run; ping-pong on 2 ranks.
	pinnedSeen := false
	for _, j := range lab.jobs {
		if j.Workload == "pingpong" && j.Ranks != 2 {
			t.Errorf("pingpong with %d ranks", j.Ranks)
		}
		if strings.Contains(strings.Join(j.Args, " "), "--loops-per-us 512.500") {
			pinnedSeen = true
		}
	}
	if !pinnedSeen {
		t.Error("work rate never pinned")
	}

	rep := NewReport(Header{Ranks: 4, Cores: 2}, testModes, samples)
	get := func(w, m string, x bool) Summary {
		for _, s := range rep.Summary {
			if s.Workload == w && s.Mode == m && s.Cross == x {
				return s
			}
		}
		t.Fatalf("no summary for %s %s %v", w, m, x)
		return Summary{}
	}
	bt := get("bt", "gateways", false)
	if bt.N != 3 || bt.RatioMin == nil || math.Abs(*bt.RatioMin-0.8) > 0.03 {
		t.Errorf("bt gateways: %+v ratio %v, want n=3 ratio ~0.8", bt, bt.RatioMin)
	}
	if d := get("bt", "direct", true); d.MinS == nil || math.Abs(*d.MinS-6) > 0.2 || *d.RatioMin != 1 {
		t.Errorf("bt direct cross: %+v", d)
	}
	// Both gateways: 0.2 s of CPU per second of the run, over 1 GiB.
	if bt.GatewayCPUS == nil || math.Abs(*bt.GatewayCPUS-0.2**bt.MedianS) > 0.002 ||
		bt.GatewayCPUPerGiB == nil || math.Abs(*bt.GatewayCPUPerGiB-*bt.GatewayCPUS) > 0.002 {
		t.Errorf("bt gateways: CPU %v s, %v s per GiB; want 0.2 x the median time %v, over 1 GiB", bt.GatewayCPUS, bt.GatewayCPUPerGiB, bt.MedianS)
	}
	if d := get("bt", "direct", false); d.GatewayCPUS != nil || d.GatewayCPUPerGiB != nil {
		t.Errorf("bt direct: gateway CPU %v, %v s per GiB; want none", d.GatewayCPUS, d.GatewayCPUPerGiB)
	}
	ft := get("ft", "gateways", false)
	if ft.N != 0 || ft.Failed != 3 || ft.MinS != nil || ft.RatioMin != nil ||
		!strings.Contains(ft.Errors[0], "verification failed") {
		t.Errorf("failed cell must stay empty and say why: %+v", ft)
	}
	cg := get("cg", "direct", true)
	if cg.Failed == 0 || cg.N == 0 || !strings.Contains(cg.Errors[0], "lab is not up") {
		t.Errorf("partly failed cg cell: %+v", cg)
	}
	// 2 modes x 3 sizes (no ping-pong with competing traffic), sizes ascending.
	if len(rep.PingPong) != 6 || rep.PingPong[0].Size != 1 || rep.PingPong[2].Size != 1<<20 ||
		rep.PingPong[3].Mode != "gateways" || rep.PingPong[0].N != 3 {
		t.Errorf("ping summary: %+v", rep.PingPong)
	}

	dir := t.TempDir()
	files, err := rep.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 {
		t.Errorf("want json + 3 csv, got %v", files)
	}
	sum, _ := os.ReadFile(filepath.Join(dir, "summary.csv"))
	if !strings.Contains(string(sum), "ft,gateways,false,0,3,,,,,,,,,,,FAILED: verification failed") {
		t.Errorf("summary.csv does not mark the failed cell:\n%s", sum)
	}
	back, err := ReadReport(filepath.Join(dir, "results.json"))
	if err != nil || len(back.Summary) != len(rep.Summary) || len(back.Samples) != len(samples) {
		t.Fatalf("results.json round trip: %v", err)
	}
	var table bytes.Buffer
	back.WriteTable(&table)
	if !strings.Contains(table.String(), "2 cores") || !strings.Contains(table.String(), "FAILED") ||
		!strings.Contains(table.String(), "gw_cpu_s") {
		t.Errorf("table:\n%s", table.String())
	}

	figs, err := back.DrawFigures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(figs) != 4 {
		t.Fatalf("want bars and pingpong as png+svg, got %v", figs)
	}
	for _, f := range figs {
		b, err := os.ReadFile(f)
		if err != nil || len(b) < 1000 {
			t.Fatalf("%s: %d bytes, %v", f, len(b), err)
		}
		if strings.HasSuffix(f, ".png") {
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil || img.Bounds().Dx() < 800 {
				t.Errorf("%s: not a sensible PNG: %v", f, err)
			}
		} else if !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("%s: not SVG", f)
		}
	}
	if dst := os.Getenv("NPB_FIGURE_DIR"); dst != "" {
		// For looking at the figures by eye: NPB_FIGURE_DIR=/tmp/x go test ...
		for _, f := range figs {
			b, _ := os.ReadFile(f)
			_ = os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644)
		}
	}
}

func TestJudge(t *testing.T) {
	cell := Cell{Workload: "bt", Mode: "direct"}
	good := readFixture(t, "bt-openmpi.out")
	if s := judge(cell, good, nil); !s.OK() || s.Note != "" {
		t.Errorf("clean run: %+v", s)
	}
	// Result complete, then the job was killed (MPICH finalize hang): kept, noted.
	if s := judge(cell, good, errors.New("killed")); !s.OK() || !strings.Contains(s.Note, "killed") {
		t.Errorf("result then kill: %+v", s)
	}
	if s := judge(Cell{Workload: "cg"}, good, nil); s.OK() {
		t.Error("result of another workload accepted")
	}
	// A complete, verified result from a run during which the emulator was
	// starved is not a measurement of the WAN: refused, and said why.
	stall := &LabStalled{Packets: 3, Err: errors.New("killed")}
	if s := judge(cell, good, stall); s.OK() || !strings.Contains(s.Err, "lab stalled: 3 packets") ||
		!strings.Contains(s.Err, "the run: killed") {
		t.Errorf("stalled lab: %+v", s)
	}
	if s := judge(cell, []byte("mpirun: not found\n"), errors.New("exit status 127")); s.OK() ||
		!strings.Contains(s.Err, "exit status 127: mpirun: not found") {
		t.Errorf("failed launch: %+v", s)
	}
	if s := judge(cell, nil, nil); s.OK() || !strings.Contains(s.Err, "no MPI5K-RESULT") {
		t.Errorf("empty output: %+v", s)
	}
	if s := judge(Cell{Workload: "ft"}, readFixture(t, "ft-corrupt-openmpi.out"), errors.New("exit status 1")); s.OK() ||
		!strings.Contains(s.Err, "verification failed") {
		t.Errorf("corrupt: %+v", s)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %g, want %g", c.in, got, c.want)
		}
	}
}

// The NPB fixtures follow NPB 3.4's report layout (hand-written, the
// project does not ship NPB).
func TestParseNPB(t *testing.T) {
	o, err := ParseOutput(bytes.NewReader(readFixture(t, "npb-bt.A.4.out")))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Results) != 1 || o.Results[0].Workload != "bt" || o.Results[0].TimeS != 41.27 ||
		o.Results[0].Ranks != 4 || !o.Results[0].Verified || o.Results[0].MPI != "npb" {
		t.Fatalf("NPB report misread: %+v", o.Results)
	}
	cell := Cell{Workload: "bt.A.4", Mode: "direct"}
	if s := judge(cell, readFixture(t, "npb-bt.A.4.out"), nil); !s.OK() || s.Result.Workload != "bt.A.4" {
		t.Errorf("NPB cell: %+v", s)
	}
	s := judge(cell, readFixture(t, "npb-bt.A.4-unsuccessful.out"), nil)
	if s.OK() || !strings.Contains(s.Err, "UNSUCCESSFUL") {
		t.Errorf("unsuccessful NPB verification accepted: %+v", s)
	}
	// A run that died before its report ends is an error, not a time.
	cut := bytes.Split(readFixture(t, "npb-bt.A.4.out"), []byte(" Verification    ="))[0]
	if _, err := ParseOutput(bytes.NewReader(cut)); err == nil || !strings.Contains(err.Error(), "incomplete NPB report") {
		t.Errorf("truncated NPB report: %v", err)
	}
	c := Config{Workloads: []string{"bt.A.4"}, Modes: testModes, Reps: 1, Cross: []bool{false}, Ranks: 4, Scale: 1}
	if err := c.Validate(); err == nil {
		t.Error("NPB workload accepted without its binary")
	}
	c.NPB = map[string]string{"bt.A.4": "/npb/bin/bt.A.4"}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	lab := &fakeLab{base: map[string]float64{}, speed: map[string]float64{}}
	lab.fail = func(j Job, _ int) (string, error, bool) {
		if j.Program != "/npb/bin/bt.A.4" || len(j.Args) != 0 {
			t.Errorf("NPB job: program %q args %v", j.Program, j.Args)
		}
		return string(readFixture(t, "npb-bt.A.4.out")), nil, true
	}
	samples, err := Run(context.Background(), c, lab, nil)
	if err != nil || len(samples) != 2 || !samples[0].OK() || samples[1].Result.TimeS != 41.27 {
		t.Errorf("NPB run: %+v %v", samples, err)
	}
}

// TestParseGatewayCPU: the summary's per-gateway line is read whole; a
// garbled one is an error naming the field.
func TestParseGatewayCPU(t *testing.T) {
	o, err := ParseOutput(strings.NewReader("mpi5k: gateway summary\n  MPI5K-GATEWAY site=a cpu_s=0.250 wan_bytes=1024 cpu_total_s=1.5\n" +
		"  MPI5K-GATEWAY site=b cpu_s=0.5 wan_bytes=2048 cpu_total_s=2 renewals=7 yields=3\n"))
	if err != nil || len(o.Gateways) != 2 || o.Gateways[0] != (GatewayCPU{Site: "a", CPUS: 0.25, WANBytes: 1024, CPUTotalS: 1.5}) ||
		o.Gateways[1] != (GatewayCPU{Site: "b", CPUS: 0.5, WANBytes: 2048, CPUTotalS: 2, Renewals: 7, Yields: 3}) {
		t.Fatalf("got %+v, %v", o.Gateways, err)
	}
	if _, err := ParseOutput(strings.NewReader("MPI5K-GATEWAY site=a cpu_s=1 wan_bytes=1 cpu_total_s=1 yields=-1\n")); err == nil || !strings.Contains(err.Error(), "yields") {
		t.Errorf("garbled yields: %v", err)
	}
	if _, err := ParseOutput(strings.NewReader("MPI5K-GATEWAY site=a cpu_s=fast wan_bytes=1 cpu_total_s=1\n")); err == nil || !strings.Contains(err.Error(), "cpu_s") {
		t.Errorf("garbled line: %v", err)
	}
}

// TestExpressEvents: both gateways of a pair count a renewal, so the
// run's renewals are half their sum (rounded up); yields are one side's
// each and add up.
func TestExpressEvents(t *testing.T) {
	s := Sample{Gateways: []GatewayCPU{{Site: "a", Renewals: 7, Yields: 3}, {Site: "b", Renewals: 6, Yields: 1}}}
	if r, y := s.expressEvents(); r != 7 || y != 4 {
		t.Errorf("renewals %d (want 7), yields %d (want 4)", r, y)
	}
	if r, y := (Sample{}).expressEvents(); r != 0 || y != 0 {
		t.Errorf("no gateways: %d renewals, %d yields", r, y)
	}
}

// TestSummarizePerMessage: the gateways' CPU per WAN message, the time
// each of a rank's WAN messages added against direct, and the job's own
// WAN rate, from samples whose figures give round numbers.
func TestSummarizePerMessage(t *testing.T) {
	res := func(time float64, wanMsgs uint64) *Result {
		return &Result{Workload: "lu", Ranks: 4, TimeS: time, WANBytes: 125_000_000, WANMsgs: wanMsgs, Verified: true}
	}
	var samples []Sample
	for rep, d := range []float64{0, 0.2, 0.1} {
		samples = append(samples,
			Sample{Cell: Cell{Rep: rep, Workload: "lu", Mode: "direct"}, Result: res(10+d, 40_000)},
			Sample{Cell: Cell{Rep: rep, Workload: "lu", Mode: "gateways"}, Result: res(10.4+d, 40_000),
				Gateways: []GatewayCPU{{Site: "a", CPUS: 0.3}, {Site: "b", CPUS: 0.1 + d}}})
	}
	sum := Summarize(samples, []string{"direct", "gateways"}, "direct")
	if len(sum) != 2 {
		t.Fatalf("%d cells, want 2", len(sum))
	}
	d, g := sum[0], sum[1]
	near := func(what string, p *float64, want float64) {
		t.Helper()
		if p == nil {
			t.Errorf("%s unset, want %g", what, want)
		} else if diff := *p - want; diff > 1e-6*max(1, want) || -diff > 1e-6*max(1, want) {
			t.Errorf("%s = %g, want %g", what, *p, want)
		}
	}
	// Median CPU 0.5 s over 40,000 messages.
	near("gw_cpu_us_per_msg", g.GatewayCPUPerMsgUs, 12.5)
	// Median 10.5 s against 10.1 s, each rank sent 10,000 WAN messages.
	near("added_us_per_msg", g.AddedUsPerMsg, 40)
	// 1 Gbit over the median 10.1 s direct run.
	near("job_mbit_s direct", d.JobMbit, 1000/10.1)
	if d.GatewayCPUPerMsgUs != nil || d.AddedUsPerMsg != nil {
		t.Errorf("the reference mode has per-message figures: %v %v", d.GatewayCPUPerMsgUs, d.AddedUsPerMsg)
	}
}
