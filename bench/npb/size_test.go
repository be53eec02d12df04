package npb

import (
	"context"
	"math"
	"strings"
	"testing"
)

// At size A every pattern workload's parameters give the targets they were
// derived from: the volume between the sites (for the kernels sized by
// volume; the others by their iteration count), and each rank's compute.
func TestSizeA(t *testing.T) {
	for _, w := range Workloads {
		spec, ok, err := SizeFor(w, "A", 1)
		if err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		if w == "pingpong" {
			if ok {
				t.Errorf("pingpong sized at A: %+v", spec)
			}
			continue
		}
		if !ok {
			t.Errorf("%s: not sized at A", w)
			continue
		}
		target := sizeA[w]
		p := perIter[w]
		wan := float64(spec.Iters) * p.wanBytes * spec.SizeScale
		compute := float64(spec.Iters) * p.computeUs * spec.ComputeScale / 1e6
		t.Logf("%s: %v -> %.0f MB between the sites, %.2f s compute per rank", w, spec.Args(), wan/1e6, compute)
		if target.wanBytes > 0 && math.Abs(wan/target.wanBytes-1) > 0.02 {
			t.Errorf("%s: %.0f MB between the sites, target %.0f MB", w, wan/1e6, target.wanBytes/1e6)
		}
		if target.iters > 0 && spec.Iters != target.iters {
			t.Errorf("%s: %d iterations, the kernel has %d", w, spec.Iters, target.iters)
		}
		if math.Abs(compute/target.computeS-1) > 1e-9 || math.Abs(spec.ComputeS-target.computeS) > 1e-9 {
			t.Errorf("%s: %.3f s of compute, target %.3f s", w, compute, target.computeS)
		}
		if math.Abs(spec.WANBytes-wan) > 1 {
			t.Errorf("%s: spec says %.0f bytes, parameters give %.0f", w, spec.WANBytes, wan)
		}
	}
	// BT at A: the volume and messages issue 36 measured.
	bt, _, _ := SizeFor("bt", "A", 1)
	if bt.Iters != 100 || bt.SizeScale != 1 {
		t.Errorf("bt at A: %+v, want 100 steps of the class B messages (26 and 160 KiB)", bt)
	}
	// LU stays latency-bound: ~1 KiB messages, 62,000 of them.
	lu, _, _ := SizeFor("lu", "A", 1)
	if msgs := lu.Iters * 2 * 2 * 100; lu.SizeScale != 1 || msgs < 60000 || msgs > 64000 {
		t.Errorf("lu at A: %+v gives %d small messages of %.0f B", lu, msgs, 1024*lu.SizeScale)
	}
}

// --scale shortens a size-A run: fewer iterations, the same messages and
// gaps; never below one iteration.
func TestSizeAScaled(t *testing.T) {
	full, _, _ := SizeFor("bt", "A", 1)
	tenth, _, _ := SizeFor("bt", "A", 0.1)
	if tenth.Iters != 10 || tenth.ComputeScale != full.ComputeScale || tenth.SizeScale != full.SizeScale {
		t.Errorf("bt at A, scale 0.1: %+v (full %+v)", tenth, full)
	}
	tiny, _, _ := SizeFor("mg", "A", 0.001)
	if tiny.Iters != 1 {
		t.Errorf("mg at A, scale 0.001: %d iterations, want 1", tiny.Iters)
	}
}

func TestSizeErrors(t *testing.T) {
	if _, ok, err := SizeFor("bt", "small", 1); err != nil || ok {
		t.Errorf("size small: ok=%v err=%v, want the workload left as it is", ok, err)
	}
	for _, c := range []struct {
		size  string
		scale float64
		want  string
	}{
		{"B", 1, `--size "B": want small or A`},
		{"a", 1, `--size "a": want small or A`},
		{"", 1, `--size "": want small or A`},
		{"A", 0, "--scale 0: must be > 0"},
		{"A", math.NaN(), "--scale NaN: must be > 0"},
	} {
		if _, _, err := SizeFor("bt", c.size, c.scale); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("size %q scale %v: want error containing %q, got %v", c.size, c.scale, c.want, err)
		}
	}
	for _, m := range []string{"work", "clock", "yield"} {
		if err := CheckCompute(m); err != nil {
			t.Errorf("compute %s: %v", m, err)
		}
	}
	if err := CheckCompute("spin"); err == nil || !strings.Contains(err.Error(), `--compute "spin": want work`) {
		t.Errorf("compute spin: %v", err)
	}
	if n := ComputeNote("clock"); !strings.Contains(n, "ISOLATING TOOL, not a verdict") {
		t.Errorf("clock's note: %q", n)
	}
}

// The runner hands size A's parameters to every pattern workload instead
// of --scale, and leaves the ping-pong alone.
func TestRunSizeA(t *testing.T) {
	lab := &fakeLab{base: map[string]float64{"bt": 4, "lu": 3, "pingpong": 0.5}, speed: map[string]float64{"direct": 1, "gateways": 1}}
	c := Config{Workloads: []string{"pingpong", "bt", "lu"}, Modes: testModes, Reps: 1,
		Cross: []bool{false}, Ranks: 4, Scale: 0.5, Size: "A"}
	if _, err := Run(context.Background(), c, lab, nil); err != nil {
		t.Fatal(err)
	}
	for _, j := range lab.jobs {
		args := strings.Join(j.Args, " ")
		spec, sized, _ := SizeFor(j.Workload, "A", 0.5)
		switch {
		case sized && (!strings.Contains(args, strings.Join(spec.Args(), " ")) || strings.Contains(args, "--scale")):
			t.Errorf("%s at A: args %q, want %v and no --scale", j.Workload, args, spec.Args())
		case !sized && !strings.Contains(args, "--scale 0.5"):
			t.Errorf("%s: args %q, want --scale 0.5", j.Workload, args)
		}
	}
}

// A figure says which compute mode and size made it; a clock run's says it
// isolates.
func TestBarTitle(t *testing.T) {
	for _, c := range []struct {
		h    Header
		want string
	}{
		{Header{Compute: "work", Size: "A"}, "time relative to direct, without competing traffic, compute work, size A"},
		{Header{Compute: "clock", Size: "small"}, "time relative to direct, without competing traffic\ncompute clock (isolating: gateways' CPU cost hidden), size small"},
		{Header{}, "time relative to direct, without competing traffic"},
	} {
		if got := barTitle(c.h, "direct", false); got != c.want {
			t.Errorf("%+v: title %q, want %q", c.h, got, c.want)
		}
	}
}
