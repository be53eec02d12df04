package npb

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Sizes are the workload sizes of `mpi5k bench --size`: "small", runs of
// 4-5 s at --scale 1 that keep the NPB class B message sizes and gaps
// (bench/README.md), and "A", the WAN volumes, message sizes and compute
// of the NAS kernels at size A with 4 ranks on 2 sites, the runs issue 36
// compares against.
var Sizes = []string{"small", "A"}

// ComputeModes are the workloads' compute gaps (`--compute`): work, the
// verdict's mode, and clock and yield, tools that isolate the network.
var ComputeModes = []string{"work", "clock", "yield"}

// CheckCompute names a bad --compute value and the fix.
func CheckCompute(mode string) error {
	for _, m := range ComputeModes {
		if mode == m {
			return nil
		}
	}
	return fmt.Errorf("--compute %q: want work (the verdict: real arithmetic at a pinned rate), "+
		"clock or yield (isolating tools: the gaps spin on the clock)", mode)
}

// CheckSize names a bad --size value and the fix.
func CheckSize(size string) error {
	for _, s := range Sizes {
		if size == s {
			return nil
		}
	}
	return fmt.Errorf("--size %q: want %s", size, strings.Join(Sizes, " or "))
}

// perIter is what one iteration of a workload (as --iters counts them) does
// with 4 ranks on 2 sites at --size-scale 1 and --compute-scale 1: the
// payload it sends between the sites (all ranks, both directions, as the
// program's wan_bytes counts it) and the compute of each rank (µs; the
// gaps of the C sources). TestPerIterMatchesProgram checks the bytes
// against the program.
var perIter = map[string]struct{ wanBytes, computeUs float64 }{
	"bt": {7192576, 8 * 248000},
	"sp": {6486000, 8 * 145000}, // sizes vary per message: the mean of 2 iterations
	"cg": {1843200, 75000},
	"lu": {1228800, 2 * 100 * 4000},
	"mg": {2949040, 14 * 26000},
	"ft": {16777248, 1200000},
	"is": {4619000, 500000}, // sizes vary per pair and iteration: the mean
}

// SizeSpec is a workload at one size: the program's parameters and the
// targets they were derived from.
type SizeSpec struct {
	Iters        int     // --iters
	ComputeScale float64 // --compute-scale
	SizeScale    float64 // --size-scale
	// Targets at 4 ranks on 2 sites: the payload between the sites over
	// the run, each rank's compute, and where the figures come from.
	WANBytes float64
	ComputeS float64
	Source   string
}

// sizeA holds the size-A targets. BT's volume and compute are measured
// (issue 36: ~720 MB across the WAN; bt.A.4's own time, 41.3 s, in
// testdata); the others are derived from the NPB 3.4 class A problem sizes
// and iteration counts, with compute from NPB's operation counts at BT's
// measured rate (1.02 Gop/s per rank): estimates, not measurements.
var sizeA = map[string]struct {
	iters     int     // iterations of the program (the kernel's own count)
	wanBytes  float64 // target volume; iters follows from it when > 0
	computeS  float64
	sizeScale float64
	source    string
}{
	"bt": {0, 720e6, 41.3, 1, "measured: 720 MB across the WAN (issue 36), 41.3 s (bt.A.4); messages 26 and 160 KiB as in class B"},
	"sp": {0, 1310e6, 20.9, 1, "estimate: BT's 720 MB times SP/BT of design brief §4 (5.1/2.8 GiB); 85.0 Gop"},
	"lu": {155, 0, 29.3, 1, "estimate: 62,000 pipeline messages of ~1 KiB (2 cross-site pairs x 2 sweeps x 62 planes x 250 iterations); 119.3 Gop"},
	"cg": {0, 175e6, 0.37, 56000.0 / (150 * 1024), "estimate: 390 mat-vecs x 4 ranks x 56 kB segments (14000 rows / 2 x 8 B); 1.5 Gop"},
	"mg": {4, 0, 0.89, 262144.0 / (135 * 1024), "estimate: 4 V-cycles, finest face 128x256 doubles (256 kB); 3.6 Gop"},
	"ft": {7, 0, 1.75, 4, "estimate: 7 transposes (6 iterations + the first FFT) of 8 MiB per pair (256x256x128 complex / 16 pairs); 7.1 Gop"},
	"is": {10, 0, 1.0, 2 * 1024 * 1024 / ((512*1024 + 629146) / 2.0), "estimate: 10 iterations, 2 MiB of keys per pair (2^23 keys x 4 B / 16 pairs); compute estimated"},
}

// SizeFor returns workload w's parameters at size; ok is false when the
// size leaves w as it is (size small, the ping-pong, an NPB binary).
// scale multiplies the iterations (at least 1), as --scale does at size
// small, so a short run of size A keeps its messages and gaps.
func SizeFor(w, size string, scale float64) (spec SizeSpec, ok bool, err error) {
	if err := CheckSize(size); err != nil {
		return SizeSpec{}, false, err
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return SizeSpec{}, false, fmt.Errorf("--scale %g: must be > 0", scale)
	}
	if size == "small" || w == "pingpong" {
		return SizeSpec{}, false, nil
	}
	t, known := sizeA[w]
	p := perIter[w]
	if !known {
		return SizeSpec{}, false, nil
	}
	iters := t.iters
	if t.wanBytes > 0 {
		iters = int(math.Round(t.wanBytes / (p.wanBytes * t.sizeScale)))
	}
	spec = SizeSpec{SizeScale: t.sizeScale, ComputeS: t.computeS, Source: t.source,
		WANBytes: float64(iters) * p.wanBytes * t.sizeScale}
	// The compute per iteration stays that of the whole run at scale 1.
	spec.ComputeScale = t.computeS * 1e6 / (float64(iters) * p.computeUs)
	spec.Iters = max(1, int(math.Round(float64(iters)*scale)))
	return spec, true, nil
}

// Args are the spec's arguments of mpi5k-workload.
func (s SizeSpec) Args() []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	return []string{"--iters", strconv.Itoa(s.Iters), "--compute-scale", f(s.ComputeScale), "--size-scale", f(s.SizeScale)}
}

// PerIterWANBytes is the payload one iteration of workload w sends between
// the sites with 4 ranks on 2 sites at --size-scale 1, as the size model
// assumes it (0 for a workload it does not size).
func PerIterWANBytes(w string) float64 { return perIter[w].wanBytes }
