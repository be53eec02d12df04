package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/bench/npb"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/testbed"
)

func init() {
	register("bench", "compare MPI workloads run direct vs through the gateways on the lab; tables, CSV/JSON, figures", runBench)
}

func runBench(args []string) int {
	if len(args) > 0 && args[0] == "_tcpping" {
		return runTCPPing(args[1:])
	}
	fs := pflag.NewFlagSet("mpi5k bench", pflag.ContinueOnError)
	cmd := cli.Command{Name: "mpi5k bench", Stdout: os.Stdout, Stderr: os.Stderr, Help: func(w io.Writer) {
		fmt.Fprintf(w, "usage: mpi5k bench [flags]       (needs a lab: mpi5k lab up)\n"+
			"       mpi5k bench --redraw DIR/results.json\n\nflags:\n%s%s", fs.FlagUsages(), cli.ExitStatusHelp(false))
	}}
	self, _ := os.Executable()
	f := benchFlagSet(fs, filepath.Dir(self))
	if code, done := cmd.Parse(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return cmd.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *f.timeout == 0 {
		return cmd.Usagef("--timeout 0: want a limit per run, e.g. 3m")
	}
	fail := func(err error) int {
		if u, ok := err.(usageError); ok {
			return cmd.Usagef("%v", u.error)
		}
		return cmd.Failf("%v", err)
	}
	if *f.redraw != "" && filepath.Base(*f.redraw) == "demo.json" {
		return redrawDemo(*f.redraw)
	}
	if *f.redraw != "" {
		rep, err := npb.ReadReport(*f.redraw)
		if err != nil {
			return fail(err)
		}
		return finishReport(rep, filepath.Dir(*f.redraw), false)
	}
	if *f.demo {
		if err := f.demoDefaults(); err != nil {
			return fail(err)
		}
	}
	c, crossMix, err := f.config()
	if err != nil {
		return fail(err)
	}
	// Bad flags are reported before anything touches a lab: the rank count
	// is known only from the lab, so check the rest with a provisional one.
	launcher := map[string]string{"openmpi": "mpirun.openmpi", "mpich": "mpiexec.mpich"}[*f.flavour]
	if launcher == "" {
		return fail(usagef("--flavour %q: want openmpi or mpich", *f.flavour))
	}
	c.Ranks = max(*f.ranks, 2)
	if err := c.Validate(); err != nil {
		return fail(usageError{err})
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var code int
	if *f.demo {
		code, err = f.runDemo(ctx, c, self, launcher)
	} else {
		code, err = f.runOnLab(ctx, c, crossMix, self, launcher)
	}
	if err != nil {
		return fail(err)
	}
	return code
}

// benchFlags are mpi5k bench's flags.
type benchFlags struct {
	fs                                    *pflag.FlagSet
	labName, flavour, lanCC, wanCC, cross *string
	crossCC, crossPat, compute, size, out *string
	binDir, npbDir, redraw                *string
	workloads, modes, ccPairs             *[]string
	gwModes                               *[]string
	relay, dryRun, demo                   *bool
	wanConns, reps, crossFlows, ranks     *int
	crossSeed                             *uint64
	scale                                 *float64
	timeout                               *time.Duration
}

// benchFlagSet declares the flags on fs; bindir is the default of --bin.
func benchFlagSet(fs *pflag.FlagSet, bindir string) *benchFlags {
	f := &benchFlags{fs: fs,
		labName:    fs.String("lab", testbed.DefaultName, "lab to run on"),
		flavour:    fs.String("flavour", "openmpi", "MPI flavour: openmpi or mpich"),
		workloads:  fs.StringSlice("workloads", npb.Workloads, "workloads to run"),
		modes:      fs.StringSlice("modes", []string{"direct", "gateways"}, "modes: direct, gateways (first is the reference)"),
		ccPairs:    fs.StringSlice("cc", nil, "extra gateway modes LAN/WAN congestion control, e.g. cubic/bbr (repeatable)"),
		relay:      fs.Bool("relay", false, "add the ping-pong baseline through a plain socat relay chain on the gateway hosts (raw TCP)"),
		lanCC:      fs.String("lan-cc", "", "congestion control of the gateways' LAN sockets in mode gateways"),
		wanCC:      fs.String("wan-cc", "", "congestion control of the gateways' WAN sockets in mode gateways"),
		wanConns:   new(int),
		gwModes:    fs.StringArray("gw-mode", nil, "extra gateway mode NAME='FLAGS of mpi5k run', e.g. k4='--wan-conns 4' or paced='--wan-pace 190mbit --wan-cc cubic' (repeatable)"),
		reps:       fs.Int("reps", 2, "repetitions of every cell (modes interleaved A B A B); 2 keep the defaults within ~16 min on a 2-core lab"),
		cross:      fs.String("cross", "both", "competing WAN traffic: none, with, or both"),
		crossFlows: new(int),
		crossCC:    fs.String("cross-cc", "", "congestion control of the competing flows, as lab cross --cc: one for all (cubic) or one per flow (cubic,bbr)"),
		crossPat:   fs.String("cross-pattern", "", "pattern of the competing flows, as lab cross --pattern: bulk, onoff, or one per flow (bulk,onoff)"),
		crossSeed:  fs.Uint64("cross-seed", 0, "seed of the on/off competing flows' sizes and gaps (0: each run picks one)"),
		scale:      fs.Float64("scale", 1, "workload --scale (iteration counts)"),
		ranks:      new(int),
		compute:    fs.String("compute", "work", "compute gaps: work (the verdict: calibrated arithmetic, the rate of the first run pinned for all, so CPU the gateways take shows in the times), clock or yield (isolating tools, not a verdict: the gaps spin on the clock, yield giving the core away meanwhile, so the network alone shows)"),
		size:       fs.String("size", "small", "workload size: small (runs of 4-5 s at --scale 1, class B messages and gaps) or A (the NAS kernels' WAN volumes, messages and compute at size A with 4 ranks; --scale shortens it)"),
		timeout:    new(time.Duration),
		out:        fs.String("out", "", "result directory (default bench/npb/results/<time>)"),
		binDir:     fs.String("bin", bindir, "directory holding bench/<flavour>/mpi5k-workload"),
		npbDir:     fs.String("npb-dir", "", "also run the real NPB MPI binaries in DIR (bt.A.x, is.W.4, ...); alone unless --workloads is given"),
		redraw:     fs.String("redraw", "", "re-read a results.json, print its table and redraw its figures"),
		dryRun:     fs.Bool("dry-run", false, "print the plan and the command lines, run nothing"),
		demo:       fs.Bool("demo", false, "what to expect, in minutes: the workloads direct and through the gateways on an idle, a lossy (0.1 %) and a shared (one CUBIC flow each way) WAN, each on a lab of its own (2 sites x 2 nodes, RTT 20 ms, 200 Mbit/s, CUBIC hosts), one table and one figure"),
	}
	fs.Var(cli.IntRange{P: f.wanConns, Min: 0, Max: 63, What: "bulk WAN connections"}, "wan-conns", "WAN connections per site pair in the gateway modes (0: the gateways' default)")
	*f.crossFlows, *f.timeout = 1, 3*time.Minute
	fs.Var(cli.IntRange{P: f.crossFlows, Min: 1, Max: 64, What: "flows"}, "cross-flows", "competing flows per direction (default 1, or one per --cross-cc or --cross-pattern entry)")
	fs.Var(cli.IntRange{P: f.ranks, Min: 0, Max: 1 << 16, What: "ranks"}, "ranks", "ranks for the pattern workloads (0: every node of the lab)")
	fs.Var(cli.Duration{P: f.timeout}, "timeout", "limit per run (10m at --size A unless given)")
	return f
}

// usageError is a bad command line (cli.ExitUsage); any other error is a
// failure.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// demoDefaults sets what --demo implies for the flags the command line
// leaves alone.
func (f *benchFlags) demoDefaults() error {
	fs := f.fs
	// The demo's conditions set the WAN and its competing traffic.
	for _, name := range []string{"cross", "cross-cc", "cross-flows", "cross-pattern", "cross-seed"} {
		if fs.Changed(name) {
			return usagef("--%s: --demo sets the WAN and the competing traffic of its conditions itself; drop --%s, or run without --demo on a lab of your own", name, name)
		}
	}
	// A few minutes on a 2-core machine: one repetition at half scale
	// of every pattern workload, unless the flags say otherwise.
	if !fs.Changed("reps") {
		*f.reps = 1
	}
	if !fs.Changed("scale") {
		*f.scale = 0.5
	}
	if !fs.Changed("workloads") {
		*f.workloads = demoWorkloads
	}
	if !fs.Changed("lab") {
		*f.labName = fmt.Sprintf("mpi5k-demo-%d", os.Getpid()%100000)
	}
	if !fs.Changed("out") {
		*f.out = filepath.Join("bench", "npb", "results", "demo-"+time.Now().Format("20060102-150405"))
	}
	return nil
}

// config is the runner's configuration the flags describe, and the
// competing traffic's mix; the rank count is left to the caller.
func (f *benchFlags) config() (npb.Config, testbed.CrossMix, error) {
	fs := f.fs
	var none testbed.CrossMix
	if err := npb.CheckCompute(*f.compute); err != nil {
		return npb.Config{}, none, usageError{err}
	}
	if err := npb.CheckSize(*f.size); err != nil {
		return npb.Config{}, none, usageError{err}
	}
	if *f.size == "A" && !fs.Changed("timeout") {
		// BT at size A took 234 s direct with competing traffic (issue 36).
		*f.timeout = 10 * time.Minute
	}
	c := npb.Config{Workloads: *f.workloads, Reps: *f.reps, Scale: *f.scale, Size: *f.size, Timeout: *f.timeout,
		PinWork: *f.compute == "work"}
	if *f.npbDir != "" {
		found, err := findNPB(*f.npbDir)
		if err != nil {
			return c, none, fmt.Errorf("--npb-dir: %v", err)
		}
		if !fs.Changed("workloads") {
			c.Workloads = nil
		}
		c.NPB = map[string]string{}
		for _, p := range found {
			c.NPB[filepath.Base(p)] = p
			c.Workloads = append(c.Workloads, filepath.Base(p))
		}
	}
	crossMix := testbed.CrossMix{CC: testbed.ParseCrossList(*f.crossCC), Pattern: testbed.ParseCrossList(*f.crossPat), Seed: *f.crossSeed}
	if !fs.Changed("cross-flows") {
		*f.crossFlows = 0 // one per list entry, else 1
	}
	check := crossMix
	check.Flows, check.Duration = *f.crossFlows, time.Minute
	if err := check.Normalize(); err != nil {
		// The mix speaks lab cross's flags; these are bench's.
		return c, none, usagef("%s", strings.ReplaceAll(err.Error(), "--", "--cross-"))
	}
	switch *f.cross {
	case "none":
		c.Cross = []bool{false}
	case "with":
		c.Cross = []bool{true}
	case "both":
		c.Cross = []bool{false, true}
	default:
		return c, none, usagef("--cross %q: want none, with or both", *f.cross)
	}
	if *f.compute != "work" { // the program's default
		c.ExtraArgs = append(c.ExtraArgs, "--compute", *f.compute)
	}
	modes, err := f.benchModes()
	c.Modes = modes
	return c, crossMix, err
}

// benchModes are the modes --modes, --cc, --gw-mode and --relay ask for,
// in that order.
func (f *benchFlags) benchModes() ([]npb.Mode, error) {
	var modes []npb.Mode
	for _, m := range *f.modes {
		switch m {
		case "direct":
			modes = append(modes, npb.Direct)
		case "gateways":
			modes = append(modes, npb.Mode{Name: "gateways", Kind: npb.KindGateways,
				LANCC: *f.lanCC, WANCC: *f.wanCC, WANConns: *f.wanConns})
		default:
			return nil, usagef("--modes: unknown mode %q (want direct, gateways; see --cc)", m)
		}
	}
	for _, p := range *f.ccPairs {
		lan, wan, ok := strings.Cut(p, "/")
		if !ok || lan == "" || wan == "" {
			return nil, usagef("--cc %q: want LAN/WAN, e.g. cubic/bbr", p)
		}
		modes = append(modes, npb.Mode{Name: "gw-" + lan + "-" + wan, Kind: npb.KindGateways,
			LANCC: lan, WANCC: wan, WANConns: *f.wanConns})
	}
	for _, g := range *f.gwModes {
		m, err := parseGWMode(g)
		if err != nil {
			return nil, usagef("--gw-mode %q: %v", g, err)
		}
		modes = append(modes, m)
	}
	if *f.relay {
		modes = append(modes, npb.Mode{Name: "socat-relay", Kind: npb.KindRelay})
	}
	return modes, nil
}

// workload is the workload program of --bin and --flavour, once it and
// the MPI launcher are found.
func (f *benchFlags) workload(launcher string) (string, error) {
	wl := filepath.Join(*f.binDir, "bench", *f.flavour, "mpi5k-workload")
	if _, err := os.Stat(wl); err != nil {
		return "", fmt.Errorf("workload program %s missing (build it with `make bench-bin`): %v", wl, err)
	}
	if _, err := exec.LookPath(launcher); err != nil {
		return "", fmt.Errorf("%s not found: install the %s packages (make deps)", launcher, *f.flavour)
	}
	return wl, nil
}

// runDemo runs --demo: each condition on a lab of its own. It returns
// the exit status, or the error to report.
func (f *benchFlags) runDemo(ctx context.Context, c npb.Config, self, launcher string) (int, error) {
	// The demo's labs have 2 nodes per site: one rank each.
	if *f.ranks == 0 {
		*f.ranks = 4
	}
	c.Ranks = *f.ranks
	if err := c.Validate(); err != nil {
		return 0, usageError{err}
	}
	absOut, err := filepath.Abs(*f.out)
	if err != nil {
		return 0, err
	}
	if *f.dryRun {
		c.StallRetries = 1
		demoHeader(os.Stdout, c, npb.DemoConditions, *f.labName, absOut)
		return 0, nil
	}
	wl, err := f.workload(launcher)
	if err != nil {
		return 0, err
	}
	c.StallRetries = 1
	return runDemo(ctx, c, *f.labName, *f.flavour, wl, self, absOut, *f.compute), nil
}

// runOnLab runs the plan on the lab of --lab (or prints it: --dry-run).
// It returns the exit status, or the error to report.
func (f *benchFlags) runOnLab(ctx context.Context, c npb.Config, crossMix testbed.CrossMix, self, launcher string) (int, error) {
	lab, err := testbed.Open(*f.labName)
	if err != nil {
		return 0, fmt.Errorf("%v (start one with: mpi5k lab up --name %s, or use --demo)", err, *f.labName)
	}
	if *f.ranks == 0 {
		*f.ranks = len(lab.Hosts("", false))
	}
	c.Ranks = *f.ranks
	if err := c.Validate(); err != nil {
		return 0, usageError{err}
	}
	wl, err := f.workload(launcher)
	if err != nil {
		return 0, err
	}
	if *f.out == "" {
		*f.out = filepath.Join("bench", "npb", "results", time.Now().Format("20060102-150405"))
	}
	absOut, err := filepath.Abs(*f.out)
	if err != nil {
		return 0, err
	}
	ex := &npb.LabExecutor{Lab: lab, Flavour: *f.flavour, Workload: wl, Mpi5k: self,
		WorkDir: filepath.Join(absOut, "work"), CrossFlows: *f.crossFlows, CrossMix: crossMix, DryRun: *f.dryRun}
	if *f.size == "A" {
		printSizeA(c, *f.size)
	}
	if *f.dryRun {
		return 0, printPlan(c, ex)
	}

	h := npb.Header{Date: time.Now().UTC().Format(time.RFC3339), Version: version, Commit: cli.Commit, Cores: runtime.NumCPU(),
		Ranks: c.Ranks, MPI: *f.flavour, Lab: ex.Describe(c.Cross), Setup: ex.Setup(), Scale: c.Scale, Reps: c.Reps, Size: *f.size, Compute: *f.compute}
	h.RanksPerCore = float64(h.Ranks) / float64(h.Cores)
	fmt.Printf("# %s\n# %d runs, %d ranks on %d cores, size %s; results in %s\n# %s\n",
		h.Lab, len(c.Plan()), h.Ranks, h.Cores, h.Size, absOut, npb.ComputeNote(h.Compute))
	if h.Size == "A" && h.Ranks != 4 {
		fmt.Printf("# size A's volumes are those of 4 ranks on 2 sites; with %d ranks each rank keeps its messages and compute, so the volume changes with the partners\n", h.Ranks)
	}
	samples, runErr := npb.Run(ctx, c, ex, os.Stdout)
	rep := npb.NewReport(h, c.Modes, samples)
	code := finishReport(rep, absOut, true)
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: stopped early: %v (partial results written)\n", runErr)
		return 1, nil
	}
	return code, nil
}

// printSizeA says what each workload stands for at size A, and how sure
// that is.
func printSizeA(c npb.Config, size string) {
	for _, w := range c.Workloads {
		if spec, sized, err := npb.SizeFor(w, size, c.Scale); err == nil && sized {
			fmt.Printf("# size A %s: %s; at scale 1: %.0f MB between the sites, %.1f s compute per rank (%s)\n",
				w, strings.Join(spec.Args(), " "), spec.WANBytes/1e6, spec.ComputeS, spec.Source)
		}
	}
}

// printPlan prints every run of the plan with its command line
// (--dry-run).
func printPlan(c npb.Config, ex *npb.LabExecutor) error {
	for _, cell := range c.Plan() {
		var mode npb.Mode
		for _, m := range c.Modes {
			if m.Name == cell.Mode {
				mode = m
			}
		}
		n := c.Ranks
		if cell.Workload == "pingpong" {
			n = 2
		}
		if mode.Kind == npb.KindRelay {
			fmt.Printf("rep %d %-8s %-10s cross=%v: raw TCP ping-pong through socat on both gateway hosts\n",
				cell.Rep+1, cell.Workload, cell.Mode, cell.Cross)
			continue
		}
		args, err := c.WorkloadArgs(cell.Workload)
		if err != nil {
			return usageError{err}
		}
		argv, err := ex.Command(npb.Job{Mode: mode, Workload: cell.Workload, Ranks: n,
			Args: append(args, c.ExtraArgs...)})
		if err != nil {
			return err
		}
		fmt.Printf("rep %d %-8s %-10s cross=%v: %s\n", cell.Rep+1, cell.Workload, cell.Mode, cell.Cross,
			strings.Join(argv, " "))
	}
	return nil
}

// demoWorkloads are the pattern workloads the demo runs by default: every
// NAS-like kernel (the ping-pong says little of what a user's job sees).
var demoWorkloads = []string{"bt", "cg", "ft", "is", "lu", "mg", "sp"}

// npbName matches NPB's binary names: kernel.class.(x|nprocs).
var npbName = regexp.MustCompile(`^(bt|cg|ep|ft|is|lu|mg|sp|dt)\.[SWABCDEF]\.(x|[0-9]+)$`)

// findNPB lists the NPB binaries in dir (absolute paths, sorted).
func findNPB(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && npbName.MatchString(e.Name()) && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			out = append(out, filepath.Join(abs, e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no NPB binaries (bt.A.x, is.W.4, ...) in %s: build NPB's MPI version with `make bt CLASS=A` and point here at its bin/", abs)
	}
	return out, nil
}

// finishReport prints the table, writes the files and figures; it returns 1
// if any cell failed (the report marks them), else 0.
func finishReport(rep *npb.Report, dir string, write bool) int {
	rep.WriteTable(os.Stdout)
	var files []string
	if write {
		f, err := rep.WriteFiles(dir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mpi5k bench: %v\n", err)
			return 1
		}
		files = f
	}
	figs, err := rep.DrawFigures(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k bench: figures: %v\n", err)
		return 1
	}
	for _, f := range append(files, figs...) {
		fmt.Println("wrote", f)
	}
	for _, s := range rep.Summary {
		if s.Failed > 0 {
			return 1
		}
	}
	return 0
}

// runTCPPing is the hidden `mpi5k bench _tcpping`: the echo server
// (--listen) or the measuring client (--connect) of the relay-chain
// baseline, run inside lab hosts by the lab executor.
func runTCPPing(args []string) int {
	fs := pflag.NewFlagSet("mpi5k bench _tcpping", pflag.ContinueOnError)
	listen := fs.String("listen", "", "serve echo on ADDR")
	connect := fs.String("connect", "", "measure against ADDR")
	var o npb.TCPPingOptions
	fs.IntVar(&o.MinSize, "min-size", 1, "smallest message")
	fs.IntVar(&o.MaxSize, "max-size", 4<<20, "largest message")
	fs.IntVar(&o.Step, "step", 4, "size factor")
	fs.IntVar(&o.Reps, "reps", 20, "timed repetitions per size (fewer above 64 KiB)")
	fs.IntVar(&o.Warmup, "warmup", 2, "untimed repetitions per size")
	wait := fs.Duration("wait", 10*time.Second, "how long to retry reaching ADDR")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case *listen != "" && *connect == "":
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			fmt.Fprintf(os.Stderr, "_tcpping: %v\n", err)
			return 1
		}
		if err := npb.ServeEcho(ln); err != nil {
			fmt.Fprintf(os.Stderr, "_tcpping: %v\n", err)
			return 1
		}
		return 0
	case *connect != "" && *listen == "":
	default:
		fmt.Fprintln(os.Stderr, "_tcpping: give exactly one of --listen ADDR and --connect ADDR")
		return 2
	}
	// The relays and the server start concurrently: retry until one 1-byte
	// frame makes the whole round trip.
	deadline := time.Now().Add(*wait)
	var conn net.Conn
	for {
		c, err := net.DialTimeout("tcp", *connect, time.Second)
		if err == nil {
			if _, err = npb.TCPPing(c, npb.TCPPingOptions{MinSize: 1, MaxSize: 1, Step: 2, Reps: 1}); err == nil {
				conn = c
				break
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "_tcpping: %s not answering after %v: %v\n", *connect, *wait, err)
			return 1
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer conn.Close()
	t0 := time.Now()
	pts, err := npb.TCPPing(conn, o)
	if err != nil {
		fmt.Println(err) // a VERIFICATION FAILED line goes where the runner reads
		return 1
	}
	npb.WriteTCPPing(os.Stdout, pts, time.Since(t0))
	return 0
}

// parseGWMode reads NAME=FLAGS: a gateway mode whose `mpi5k run` gets FLAGS
// (whitespace-separated, each a --flag or its value).
func parseGWMode(s string) (npb.Mode, error) {
	name, flags, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t,/") {
		return npb.Mode{}, fmt.Errorf("want NAME='FLAGS', e.g. k4='--wan-conns 4'")
	}
	args := strings.Fields(flags)
	if len(args) == 0 || !strings.HasPrefix(args[0], "--") {
		return npb.Mode{}, fmt.Errorf("flags of mpi5k run must start with --, got %q", flags)
	}
	return npb.Mode{Name: name, Kind: npb.KindGateways, Args: args}, nil
}
