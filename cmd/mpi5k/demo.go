package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/bench/npb"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/testbed"
)

// demoLab is the lab of every demo condition but its loss: cluster nodes'
// TCP (CUBIC) on the hosts, jumbo frames for the competing flows so the
// user-space WAN emulator keeps up beside a job on a small machine.
func demoLab(name string, cond npb.Condition) testbed.Config {
	return testbed.Config{Name: name, Nodes: 2, RTT: 20 * time.Millisecond, WANRate: 200e6,
		HostCC: "cubic", CrossMTU: 9000, Loss: cond.Loss}
}

// demoCrossMix is the shared condition's competing traffic: one bulk
// CUBIC flow per direction, the TCP of the other users of a cluster's WAN.
var demoCrossMix = testbed.CrossMix{CC: []string{"cubic"}, Pattern: []string{"bulk"}}

// demoHeader says exactly what the demo runs, before it runs it.
func demoHeader(w io.Writer, c npb.Config, conds []npb.Condition, labName, out string) {
	l := demoLab(labName, npb.Condition{})
	_ = l.Normalize()
	var modes []string
	for _, m := range c.Modes {
		modes = append(modes, npb.ModeLabel(m))
	}
	runs := 0
	for _, cond := range conds {
		cc := c
		cc.Cross = []bool{cond.Cross}
		runs += len(cc.Plan())
	}
	fmt.Fprintf(w, "# mpi5k demo: workloads %s (size %s, scale %g), %d run(s) of each %s, under %d WAN conditions,\n"+
		"# one lab each, brought up and torn down in turn (%s: 2 sites x 2 nodes, RTT %v, WAN %g Mbit/s per direction, hosts' TCP %s):\n",
		strings.Join(c.Workloads, " "), orSmallSize(c.Size), c.Scale, c.Reps, strings.Join(modes, " and "), len(conds),
		labName, l.RTT, float64(l.WANRate)/1e6, l.HostCC)
	for _, cond := range conds {
		what := "nothing else on the WAN"
		switch {
		case cond.Loss > 0 && cond.Cross:
			what = fmt.Sprintf("each WAN packet dropped with probability %g, and competing flows", cond.Loss)
		case cond.Loss > 0:
			what = fmt.Sprintf("each WAN packet dropped at random with probability %g, each direction", cond.Loss)
		case cond.Cross:
			what = "one bulk CUBIC flow (iperf3) per direction between the sites' traffic hosts during every run"
		}
		fmt.Fprintf(w, "#   %-24s %s\n", cond.Label+":", what)
	}
	if c.StallRetries > 0 {
		fmt.Fprintf(w, "# a run the lab stalled during (the machine starved the WAN emulator) runs once more; a second stall fails it\n")
	}
	fmt.Fprintf(w, "# %d runs; results in %s\n", runs, out)
}

func orSmallSize(s string) string {
	if s == "" {
		return "small"
	}
	return s
}

// runDemo runs c under every demo condition, each on a lab of its own, and
// prints the side-by-side table; it returns the exit status: 1 when a lab
// could not be built, a run failed or the demo stopped early.
func runDemo(ctx context.Context, c npb.Config, labName, flavour, wl, self, out string, compute string) int {
	conds := npb.DemoConditions
	demoHeader(os.Stdout, c, conds, labName, out)
	d := &npb.Demo{}
	code := 0
	for i, cond := range conds {
		fmt.Printf("# condition %d/%d: %s\n", i+1, len(conds), cond.Label)
		cc := c
		cc.Cross = []bool{cond.Cross}
		rep, err := demoCondition(ctx, cc, cond, labName, flavour, wl, self, filepath.Join(out, cond.Name), compute)
		if rep != nil {
			d.Conditions = append(d.Conditions, cond)
			d.Reports = append(d.Reports, rep)
			if r := npb.WorkRate(rep.Samples); c.WorkRate == 0 && r > 0 {
				c.WorkRate = r // the same computation under every condition
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "mpi5k bench: demo, %s: %v\n", cond.Label, err)
			code = 1
			break
		}
	}
	if len(d.Reports) == 0 {
		return 1
	}
	fmt.Println()
	d.WriteTable(os.Stdout)
	if p, err := d.WriteFile(out); err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: %v\n", err)
		code = 1
	} else {
		fmt.Println("wrote", p)
	}
	figs, err := d.DrawFigure(out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: figure: %v\n", err)
		code = 1
	}
	for _, f := range figs {
		fmt.Println("wrote", f)
	}
	if d.Failed() {
		code = 1
	}
	return code
}

// demoCondition brings up the condition's lab, runs the plan on it, writes
// its report into dir and tears the lab down. The report is nil only when
// nothing ran.
func demoCondition(ctx context.Context, c npb.Config, cond npb.Condition, labName, flavour, wl, self, dir, compute string) (*npb.Report, error) {
	upCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	lab, err := testbed.Up(upCtx, demoLab(labName, cond))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	for _, n := range lab.Notes() {
		fmt.Printf("# %s\n", n)
	}
	defer func() {
		if err := testbed.Down(labName); err != nil {
			fmt.Fprintf(os.Stderr, "mpi5k bench: lab down %s: %v\n", labName, err)
		}
	}()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	ex := &npb.LabExecutor{Lab: lab, Flavour: flavour, Workload: wl, Mpi5k: self,
		WorkDir: filepath.Join(abs, "work"), CrossFlows: 1, CrossMix: demoCrossMix}
	h := npb.Header{Date: time.Now().UTC().Format(time.RFC3339), Version: version, Commit: cli.Commit,
		Cores: runtime.NumCPU(), Ranks: c.Ranks, MPI: flavour, Lab: ex.Describe(c.Cross), Setup: ex.Setup(),
		Scale: c.Scale, Reps: c.Reps, Size: orSmallSize(c.Size), Compute: compute}
	h.RanksPerCore = float64(h.Ranks) / float64(h.Cores)
	samples, runErr := npb.Run(ctx, c, ex, os.Stdout)
	if len(samples) == 0 {
		return nil, runErr
	}
	rep := npb.NewReport(h, c.Modes, samples)
	if _, err := rep.WriteFiles(abs); err != nil {
		return rep, err
	}
	if _, err := rep.DrawFigures(abs); err != nil {
		return rep, fmt.Errorf("figures: %w", err)
	}
	return rep, runErr
}

// redrawDemo prints a demo.json's table and redraws its figure; 1 if a
// cell failed.
func redrawDemo(path string) int {
	d, err := npb.ReadDemo(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: %v\n", err)
		return 1
	}
	d.WriteTable(os.Stdout)
	figs, err := d.DrawFigure(filepath.Dir(path))
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: figure: %v\n", err)
		return 1
	}
	for _, f := range figs {
		fmt.Println("wrote", f)
	}
	if d.Failed() {
		return cli.ExitFailure
	}
	return 0
}
