package npb

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Kinds of Mode.
const (
	KindDirect   = "direct"   // ranks talk over the WAN themselves
	KindGateways = "gateways" // through the mpi5k gateways
	KindRelay    = "relay"    // a plain user-space relay chain (socat) on the same path
)

// Mode is one way of connecting the sites, optionally with gateway
// settings. Name must be unique within a run; it labels CSV rows and bars.
type Mode struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	LANCC    string `json:"lan_cc,omitempty"`
	WANCC    string `json:"wan_cc,omitempty"`
	WANConns int    `json:"wan_conns,omitempty"`
	// Args are more flags of `mpi5k run` for this mode (--gw-mode), e.g.
	// --wan-pace 190mbit.
	Args []string `json:"args,omitempty"`
}

// Direct is the reference mode every ratio is computed against.
var Direct = Mode{Name: "direct", Kind: KindDirect}

// Job is one MPI run for an Executor.
type Job struct {
	Mode     Mode
	Workload string
	Args     []string // arguments of mpi5k-workload (after the binary)
	Program  string   // if set, run this MPI program (a real NPB binary) with Args instead
	Ranks    int
	Cross    bool // competing WAN traffic during the run
	Timeout  time.Duration
}

// Executor runs one job in its mode and returns the job's combined output.
// The lab executor places the ranks on the emulated sites; tests use a fake.
// An error with output still lets the runner read a result line that was
// printed before the failure (a job killed while hanging in MPI_Finalize,
// a verification failure's non-zero exit).
type Executor interface {
	Run(ctx context.Context, job Job) (output []byte, err error)
}

// Config is what to compare and how often.
type Config struct {
	Workloads []string
	Modes     []Mode // first must be Direct-like (ratios are against Modes[0])
	Reps      int
	Cross     []bool // without and/or with competing traffic
	Ranks     int
	Scale     float64
	// Size is the workloads' size (Sizes; "" is small): at A each pattern
	// workload gets the iterations, message sizes and compute of SizeFor.
	Size      string
	ExtraArgs []string // passed to every workload run (e.g. --compute clock)
	Timeout   time.Duration
	// PinWork passes the first run's measured work rate (loops_per_us) to
	// every later run so compared runs do the same amount of computation.
	PinWork bool
	// WorkRate, when PinWork is set and it is > 0, is the pinned rate from
	// the first run on (a rate measured before, e.g. under another
	// condition of the demo), so runs of separate plans compute alike.
	WorkRate float64
	// StallRetries is how many times a run the lab stalled during
	// (LabStalled: it saw no emulated WAN, so it is no measurement) runs
	// again before it counts as failed; the sample's Note says it did.
	StallRetries int
	// NPB maps extra workload names (e.g. "bt.A.x") to real NPB MPI
	// binaries, run without arguments; their result is NPB's own report.
	NPB map[string]string
}

// Validate names the first problem in c.
func (c *Config) Validate() error {
	switch {
	case len(c.Workloads) == 0:
		return errors.New("no workloads")
	case len(c.Modes) < 1:
		return errors.New("no modes")
	case c.Reps < 1:
		return fmt.Errorf("reps=%d: need at least 1", c.Reps)
	case len(c.Cross) == 0:
		return errors.New("no competing-traffic setting (want false and/or true)")
	case c.Ranks < 2:
		return fmt.Errorf("ranks=%d: need at least 2", c.Ranks)
	case c.Scale <= 0:
		return fmt.Errorf("scale=%g: must be > 0", c.Scale)
	}
	if c.Size != "" {
		if err := CheckSize(c.Size); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, m := range c.Modes {
		if m.Name == "" || seen[m.Name] {
			return fmt.Errorf("mode name %q empty or repeated", m.Name)
		}
		if m.Kind != KindDirect && m.Kind != KindGateways && m.Kind != KindRelay {
			return fmt.Errorf("mode %s: kind %q: want %s, %s or %s", m.Name, m.Kind, KindDirect, KindGateways, KindRelay)
		}
		seen[m.Name] = true
	}
	for _, w := range c.Workloads {
		if _, npb := c.NPB[w]; !KnownWorkload(w) && !npb {
			return fmt.Errorf("unknown workload %q (want one of %v, %v, or an NPB binary of --npb-dir)", w, Workloads, OptInWorkloads)
		}
	}
	return nil
}

// Workloads are the programs of mpi5k-workload, in report order.
var Workloads = []string{"pingpong", "bt", "cg", "ft", "is", "lu", "mg", "sp"}

// OptInWorkloads are the programs of mpi5k-workload run only when named:
// startup times a job's launch to its first exchange with every rank
// (MPI_Init and one Alltoall), from the wall clock at launch.
var OptInWorkloads = []string{"startup"}

// KnownWorkload reports whether w is a workload of mpi5k-workload.
func KnownWorkload(w string) bool {
	for _, k := range append(Workloads[:len(Workloads):len(Workloads)], OptInWorkloads...) {
		if k == w {
			return true
		}
	}
	return false
}

// Cell is one planned run.
type Cell struct {
	Rep      int    `json:"rep"`
	Workload string `json:"workload"`
	Mode     string `json:"mode"`
	Cross    bool   `json:"cross"`
}

// Plan orders the runs: repetitions outermost, and inside each the modes
// alternate per workload (A B A B ...), so slow drift of the machine (other
// load, thermal, a warming page cache) hits every mode alike. The ping-pong
// runs only without competing traffic: behind a full WAN queue each of its
// ~250 round trips waits for the queue, which took 63-72 s per run on a
// 200 Mbit/s lab and says nothing the pattern workloads do not.
func (c *Config) Plan() []Cell {
	var cells []Cell
	for r := 0; r < c.Reps; r++ {
		for _, x := range c.Cross {
			for _, w := range c.Workloads {
				if x && w == "pingpong" {
					continue
				}
				for _, m := range c.Modes {
					if m.Kind == KindRelay && w != "pingpong" {
						continue // the relay chain is a ping-pong baseline only
					}
					cells = append(cells, Cell{Rep: r, Workload: w, Mode: m.Name, Cross: x})
				}
			}
		}
	}
	return cells
}

// Sample is the outcome of one cell. Err is set when the run produced no
// usable result (failed, timed out, no result line, verification failed);
// a failed cell is reported as such, never replaced by a number.
type Sample struct {
	Cell
	Result   *Result     `json:"result,omitempty"`
	PingPong []PingPoint `json:"pingpong,omitempty"`
	// The gateways' CPU during the run (gateway modes; from the summary
	// of `mpi5k run`).
	Gateways []GatewayCPU `json:"gateways,omitempty"`
	// What the competing flows sent while the job ran (lab runs beside
	// them).
	Competing *CrossBytes `json:"competing,omitempty"`
	Err       string      `json:"error,omitempty"`
	Note      string      `json:"note,omitempty"` // e.g. exit status of a job whose result was complete
}

// OK reports whether the sample has a verified result.
func (s Sample) OK() bool { return s.Err == "" && s.Result != nil }

// Run executes the plan. progress (may be nil) gets one line per run.
func Run(ctx context.Context, c Config, ex Executor, progress io.Writer) ([]Sample, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	modes := map[string]Mode{}
	for _, m := range c.Modes {
		modes[m.Name] = m
	}
	plan := c.Plan()
	var samples []Sample
	pinned := ""
	if c.PinWork && c.WorkRate > 0 {
		pinned = strconv.FormatFloat(c.WorkRate, 'f', 3, 64)
	}
	start := time.Now()
	for i, cell := range plan {
		if err := ctx.Err(); err != nil {
			return samples, err
		}
		args, err := c.WorkloadArgs(cell.Workload)
		if err != nil {
			return samples, err
		}
		if pinned != "" && cell.Workload != "pingpong" && cell.Workload != "startup" {
			args = append(args, "--loops-per-us", pinned)
		}
		args = append(args, c.ExtraArgs...)
		job := Job{Mode: modes[cell.Mode], Workload: cell.Workload, Args: args,
			Ranks: c.Ranks, Cross: cell.Cross, Timeout: c.Timeout}
		if prog, ok := c.NPB[cell.Workload]; ok {
			job.Program, job.Args = prog, nil
		}
		if cell.Workload == "pingpong" {
			job.Ranks = 2 // one rank per site
		}
		t0 := time.Now()
		out, err := ex.Run(ctx, launched(job, t0))
		s := judge(cell, out, err)
		var stalled *LabStalled
		for try := 0; try < c.StallRetries && errors.As(err, &stalled) && ctx.Err() == nil; try++ {
			fmt.Fprintf(progress, "[%d/%d %s] rep %d %-8s %-10s cross=%-3s %s (%.1fs); running it again\n",
				i+1, len(plan), time.Since(start).Round(time.Second), cell.Rep+1, cell.Workload,
				cell.Mode, yesNo(cell.Cross), s.summary(), time.Since(t0).Seconds())
			t0 = time.Now()
			out, err = ex.Run(ctx, launched(job, t0))
			s = judge(cell, out, err)
			s.Note = strings.TrimPrefix(s.Note+"; "+RerunNote, "; ")
		}
		if s.OK() && c.PinWork && pinned == "" && s.Result.LoopsPerUs > 0 {
			pinned = strconv.FormatFloat(s.Result.LoopsPerUs, 'f', 3, 64)
		}
		samples = append(samples, s)
		fmt.Fprintf(progress, "[%d/%d %s] rep %d %-8s %-10s cross=%-3s %s (%.1fs)\n",
			i+1, len(plan), time.Since(start).Round(time.Second), cell.Rep+1, cell.Workload,
			cell.Mode, yesNo(cell.Cross), s.summary(), time.Since(t0).Seconds())
	}
	return samples, nil
}

// launched gives the startup workload the wall clock of its launch (at):
// its time runs from there, through the launcher, the gateways' start
// (per-job gateways of mpi5k run) and MPI_Init, to its first Alltoall.
func launched(j Job, at time.Time) Job {
	if j.Workload == "startup" && j.Program == "" {
		j.Args = append(j.Args[:len(j.Args):len(j.Args)], "--launched-at", strconv.FormatFloat(float64(at.UnixNano())/1e9, 'f', 6, 64))
	}
	return j
}

// WorkRate is the work rate (loops_per_us) of the first verified pattern
// run of samples, 0 if none: what Config.WorkRate pins for a later plan.
func WorkRate(samples []Sample) float64 {
	for _, s := range samples {
		if s.OK() && s.Workload != "pingpong" && s.Result.LoopsPerUs > 0 {
			return s.Result.LoopsPerUs
		}
	}
	return 0
}

// WorkloadArgs are the arguments of mpi5k-workload for workload w (before
// the pinned rate and ExtraArgs).
func (c *Config) WorkloadArgs(w string) ([]string, error) {
	args := []string{"--workload", w}
	spec, sized, err := SizeFor(w, cmp.Or(c.Size, "small"), c.Scale)
	if err != nil {
		return nil, err
	}
	if sized {
		return append(args, spec.Args()...), nil
	}
	return append(args, "--scale", strconv.FormatFloat(c.Scale, 'g', -1, 64)), nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (s Sample) summary() string {
	if !s.OK() {
		return "FAILED: " + s.Err
	}
	msg := fmt.Sprintf("time %.3f s", s.Result.TimeS)
	if cpu, _, ok := s.gatewayCPU(); ok {
		msg += fmt.Sprintf(", gateways %.2f s CPU", cpu)
		if r, y := s.expressEvents(); r+y > 0 {
			msg += fmt.Sprintf(", %d express renewals, %d yields", r, y)
		}
	}
	if s.Competing != nil {
		msg += fmt.Sprintf(", competing flows %.0f Mbit/s", s.Competing.Mbit())
	}
	if s.Note != "" {
		msg += " (" + s.Note + ")"
	}
	return msg
}

// gatewayCPU sums the gateways' CPU seconds and WAN bytes of the run; ok
// is false when the run reported none (direct runs).
func (s Sample) gatewayCPU() (cpu float64, wan uint64, ok bool) {
	for _, g := range s.Gateways {
		cpu += g.CPUS
		wan += g.WANBytes
	}
	return cpu, wan, len(s.Gateways) > 0
}

// expressEvents counts the express link renewals and yields of the run.
// Both gateways of a site pair count each renewal, so the sum over the
// gateways is halved (rounded up: a gateway may read its counter just
// before the renewal its peer has counted); a yield is one side's.
func (s Sample) expressEvents() (renewals, yields uint64) {
	for _, g := range s.Gateways {
		renewals += g.Renewals
		yields += g.Yields
	}
	return (renewals + 1) / 2, yields
}

// RerunNote is the Note of a sample whose first run the lab stalled
// during (Config.StallRetries).
const RerunNote = "run again after a lab stall"

// LabStalled is an Executor's error for a run during which the lab's WAN
// emulator was starved of CPU (packets left it a second or more late): the
// run did not see the WAN it was meant to, so its time is no measurement.
type LabStalled struct {
	Packets uint64 // packets that left the emulator >= 1 s late
	Err     error  // the run's own error, if any
}

func (e *LabStalled) Error() string {
	msg := fmt.Sprintf("lab stalled: %d packets left the WAN emulator 1 s or more late "+
		"(the machine starved it of CPU; see testbed/README.md)", e.Packets)
	if e.Err != nil {
		msg += "; the run: " + e.Err.Error()
	}
	return msg
}

func (e *LabStalled) Unwrap() error { return e.Err }

// judge turns a job's output and error into a sample. A verified result
// line counts even if the job then failed to exit cleanly (MPICH/UCX's
// finalize hang, see bench/README.md); anything else is a failed cell.
func judge(cell Cell, out []byte, runErr error) Sample {
	s := Sample{Cell: cell}
	o, perr := ParseOutput(bytes.NewReader(out))
	var stalled *LabStalled
	switch {
	case errors.As(runErr, &stalled):
		// Whatever the job printed, it did not run on the emulated WAN.
		s.Err = stalled.Error()
	case perr != nil:
		s.Err = "unreadable output: " + perr.Error()
	case len(o.VerifyErr) > 0:
		s.Err = "verification failed: " + o.VerifyErr[0]
	case len(o.Results) == 0 && runErr != nil:
		s.Err = "run failed: " + runErr.Error() + lastLine(out)
	case len(o.Results) == 0:
		s.Err = "no MPI5K-RESULT line in the output" + lastLine(out)
	case len(o.Results) > 1:
		s.Err = fmt.Sprintf("%d MPI5K-RESULT lines, want 1", len(o.Results))
	case !o.Results[0].Verified:
		s.Err = fmt.Sprintf("result says verified=no (failures=%d)", o.Results[0].Failures)
	case o.Results[0].MPI != "npb" && o.Results[0].Workload != cell.Workload:
		s.Err = fmt.Sprintf("result is for workload %q, ran %q", o.Results[0].Workload, cell.Workload)
	case cell.Workload == "pingpong" && len(o.PingPong) == 0:
		s.Err = "pingpong printed no MPI5K-PINGPONG lines"
	default:
		r := o.Results[0]
		r.Workload = cell.Workload // an NPB report names only the kernel
		s.Result = &r
		s.PingPong = o.PingPong
		s.Gateways = o.Gateways
		s.Competing = o.Cross
		if runErr != nil {
			s.Note = "result complete, then: " + runErr.Error()
		}
	}
	return s
}

// lastLine gives the end of a failed job's output as context for the error.
func lastLine(out []byte) string {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return ""
	}
	if i := bytes.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	if len(out) > 200 {
		out = out[:200]
	}
	return ": " + string(out)
}
