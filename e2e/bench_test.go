package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/bench/npb"
	"github.com/mpi5k/mpi5k/testbed"
)

// benchBuildWorkload builds bench/workloads' mpi5k-workload with Open MPI.
func benchBuildWorkload(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("mpicc.openmpi"); err != nil {
		t.Fatalf("mpicc.openmpi not installed: %v", err)
	}
	src, err := filepath.Glob("../bench/workloads/src/*.c")
	if err != nil || len(src) == 0 {
		t.Fatalf("workload sources not found: %v", err)
	}
	out := filepath.Join(t.TempDir(), "mpi5k-workload")
	args := append([]string{"-O2", "-std=c11", "-o", out}, src...)
	if b, err := exec.Command("mpicc.openmpi", append(args, "-lm")...).CombinedOutput(); err != nil {
		t.Fatalf("mpicc.openmpi: %v\n%s", err, b)
	}
	return out
}

// TestBenchLab: the runner on a lab, through the real lab executor: a short
// ping-pong and a short BT pattern, direct and through the gateways, with
// and without competing traffic, every cell verified and aggregated, the
// relay-chain baseline included, figures drawn. MPI5K_RUN_ARGS adds flags
// of mpi5k run to the gateway cells (e.g. --wan-skip-probe-rtt=false).
func TestBenchLab(t *testing.T) {
	labRequireRoot(t)
	if _, err := exec.LookPath("socat"); err != nil {
		t.Fatalf("socat not installed: %v", err)
	}
	wl := benchBuildWorkload(t)
	mpi5k, err := testbed.Binary()
	if err != nil {
		t.Fatal(err)
	}
	l := labUp(t, testbed.Config{Nodes: 2, RTT: 10 * time.Millisecond, WANRate: 200e6})
	dir := t.TempDir()
	ex := &npb.LabExecutor{Lab: l, Flavour: "openmpi", Workload: wl, Mpi5k: mpi5k, WorkDir: filepath.Join(dir, "work")}
	// What `mpi5k bench --dry-run` prints is built without writing anything.
	dry := *ex
	dry.DryRun, dry.WorkDir = true, filepath.Join(dir, "dry")
	if argv, err := dry.Command(npb.Job{Mode: npb.Direct, Workload: "bt", Ranks: 4}); err != nil || len(argv) == 0 {
		t.Fatalf("dry-run command: %v %v", argv, err)
	}
	if _, err := os.Stat(dry.WorkDir); !os.IsNotExist(err) {
		t.Errorf("dry-run command wrote %s (stat: %v)", dry.WorkDir, err)
	}
	c := npb.Config{
		Workloads: []string{"pingpong", "bt"},
		Modes:     []npb.Mode{npb.Direct, {Name: "gateways", Kind: npb.KindGateways, Args: strings.Fields(os.Getenv("MPI5K_RUN_ARGS"))}, {Name: "socat-relay", Kind: npb.KindRelay}},
		Reps:      1, Cross: []bool{false, true}, Ranks: 4, Scale: 0.25, Timeout: 2 * time.Minute,
		// Small gaps and few sizes keep the test short; the pattern is intact.
		ExtraArgs: []string{"--compute", "clock", "--compute-scale", "0.2", "--max-size", "65536"},
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	samples, err := npb.Run(ctx, c, ex, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	// pingpong: direct, gateways, relay; bt: direct and gateways, twice.
	if len(samples) != 3+4 {
		t.Fatalf("want 7 samples, got %d", len(samples))
	}
	for _, s := range samples {
		if !s.OK() {
			t.Errorf("%s %s cross=%v failed: %s", s.Workload, s.Mode, s.Cross, s.Err)
			continue
		}
		if s.Workload == "bt" && (s.Result.Ranks != 4 || s.Result.WANBytes == 0) {
			t.Errorf("bt %s: %+v", s.Mode, s.Result)
		}
		if s.Workload == "pingpong" && (len(s.PingPong) == 0 || s.PingPong[0].LatMedUs < 4000) {
			// A 10 ms RTT lab cannot answer in much less than 5 ms per half
			// trip (the lab calibrates its own path cost out of the delay).
			t.Errorf("pingpong %s: implausible curve %+v", s.Mode, s.PingPong)
		}
	}
	rep := npb.NewReport(npb.Header{Cores: 2, Ranks: 4, Lab: ex.Describe(c.Cross)}, c.Modes, samples)
	files, err := rep.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	figs, err := rep.DrawFigures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 || len(figs) != 4 {
		t.Errorf("files %v figures %v", files, figs)
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	if strings.Contains(table.String(), "FAILED") {
		t.Errorf("failed cells in the table")
	}
	if _, err := os.Stat(filepath.Join(dir, "bars.png")); err != nil {
		t.Error(err)
	}
}
