package npb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// LabExecutor runs jobs on an emulated grid (package testbed): ranks are
// placed in site order, one per node; mpirun starts on the first node of the
// first site; gateways mode puts `mpi5k run` in front of the same command
// line; competing traffic is iperf3 between the sites' traffic hosts.
type LabExecutor struct {
	Lab        *testbed.Lab
	Flavour    string // "openmpi" or "mpich"
	Workload   string // absolute path of mpi5k-workload built for Flavour
	Mpi5k      string // absolute path of bin/mpi5k (its `run` subcommand)
	WorkDir    string // host files and gateway work directories
	CrossFlows int    // competing flows per direction (default 1, or one per entry of CrossMix's lists)
	// CrossMix gives the competing flows their congestion controls and
	// patterns (testbed.CrossMix, as `mpi5k lab cross`); CrossFlows and the
	// run's limit set its Flows and Duration.
	CrossMix testbed.CrossMix
	Echo     io.Writer
	DryRun   bool // Command writes no host file: `mpi5k bench --dry-run` leaves nothing behind
}

// Describe is the lab line of the report header; cross is the plan's
// competing-traffic settings (Config.Cross), so the line names competing
// flows only when some run has them.
func (e *LabExecutor) Describe(cross []bool) string {
	return describeLab(e.Lab.Name(), e.Lab.Config(), e.describeCross(), cross)
}

func describeLab(name string, c testbed.Config, flows string, cross []bool) string {
	rate := "unlimited"
	if c.WANRate > 0 {
		rate = fmt.Sprintf("%g Mbit/s", float64(c.WANRate)/1e6)
	}
	jumbo := ""
	if c.LinkMTU() > c.MTU && slices.Contains(cross, true) {
		jumbo = fmt.Sprintf(" in %d-byte frames", c.LinkMTU())
	}
	competing := "no competing traffic"
	switch {
	case slices.Contains(cross, true) && slices.Contains(cross, false):
		competing = "competing traffic " + flows + " per direction in the runs marked cross"
	case slices.Contains(cross, true):
		competing = "competing traffic " + flows + " per direction"
	}
	return fmt.Sprintf("lab %s: %d sites x %d nodes, RTT %v, WAN %s per direction, queue %d B, loss %g, MTU %d, "+
		"host TCP %s, %s%s", name, len(c.Sites), c.Nodes, c.RTT, rate,
		c.Queue, c.Loss, c.MTU, c.HostTCP(), competing, jumbo)
}

// Setup is the lab's WAN in a few words, for figure titles (Header.Setup).
func (e *LabExecutor) Setup() string {
	c := e.Lab.Config()
	return SetupOf(c)
}

// SetupOf says a lab configuration's WAN in a few words: "RTT 20ms, WAN
// 200 Mbit/s, loss 0.1 %, hosts' TCP cubic".
func SetupOf(c testbed.Config) string {
	rate := "unlimited"
	if c.WANRate > 0 {
		rate = fmt.Sprintf("%g Mbit/s", float64(c.WANRate)/1e6)
	}
	return fmt.Sprintf("RTT %v, WAN %s, loss %s, hosts' TCP %s", c.RTT, rate,
		LossWords(strconv.FormatFloat(c.Loss, 'g', -1, 64)), c.HostTCP())
}

// crossMix is the competing traffic of one direction of a run lasting d.
func (e *LabExecutor) crossMix(d time.Duration, dir int) testbed.CrossMix {
	m := e.CrossMix
	m.Flows, m.Duration = e.CrossFlows, d
	if m.Seed != 0 {
		m.Seed += uint64(dir * testbed.MaxCrossFlows) // the directions draw apart
	}
	return m
}

func (e *LabExecutor) describeCross() string {
	m := e.crossMix(time.Minute, 0)
	if err := m.Normalize(); err != nil {
		return "invalid: " + err.Error()
	}
	m.Seed = e.CrossMix.Seed // 0: each run picks its own
	if len(m.CC) == 0 && len(m.Pattern) == 0 {
		return fmt.Sprintf("%d iperf3 flow(s)", m.Flows) // as the reports always said
	}
	return m.String()
}

// hosts picks job.Ranks nodes, the same number at every site, in site order
// so the workload's block placement matches the sites.
func (e *LabExecutor) hosts(ranks int) ([]string, error) {
	sites := e.Lab.Sites()
	if ranks%len(sites) != 0 {
		return nil, fmt.Errorf("%d ranks do not split evenly over %d sites", ranks, len(sites))
	}
	per := ranks / len(sites)
	var out []string
	for _, s := range sites {
		nodes := e.Lab.Hosts(s, false)
		if len(nodes) < per {
			return nil, fmt.Errorf("site %s has %d nodes, the job needs %d (one rank per node)", s, len(nodes), per)
		}
		out = append(out, nodes[:per]...)
	}
	return out, nil
}

// Command builds the job's argv (without running it) and, unless DryRun,
// writes its host file; exported so `mpi5k bench --dry-run` can show it.
func (e *LabExecutor) Command(job Job) ([]string, error) {
	hosts, err := e.hosts(job.Ranks)
	if err != nil {
		return nil, err
	}
	np := strconv.Itoa(len(hosts))
	prog := append([]string{e.Workload}, job.Args...)
	prog = append(prog, "--sites", strconv.Itoa(len(e.Lab.Sites())))
	if job.Program != "" {
		prog = append([]string{job.Program}, job.Args...)
	}
	var argv []string
	var hf strings.Builder
	switch e.Flavour {
	case "openmpi":
		for _, h := range hosts {
			fmt.Fprintf(&hf, "%s slots=1\n", h)
		}
		argv = []string{"mpirun.openmpi", "--allow-run-as-root", "-np", np, "--hostfile", "",
			"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
			"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR}
	case "mpich":
		for _, h := range hosts {
			fmt.Fprintf(&hf, "%s:1\n", h)
		}
		argv = []string{"mpiexec.mpich", "-launcher", "ssh", "-f", "", "-n", np,
			"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0"}
	default:
		return nil, fmt.Errorf("flavour %q: want openmpi or mpich", e.Flavour)
	}
	hfPath := filepath.Join(e.WorkDir, fmt.Sprintf("hosts-%s-%d", e.Flavour, len(hosts)))
	if !e.DryRun {
		if err := os.MkdirAll(e.WorkDir, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(hfPath, []byte(hf.String()), 0o644); err != nil {
			return nil, err
		}
	}
	for i := range argv {
		if argv[i] == "" {
			argv[i] = hfPath
		}
	}
	argv = append(argv, prog...)
	switch job.Mode.Kind {
	case KindDirect:
	case KindGateways:
		w := []string{e.Mpi5k, "run", "--shared-fs", "--workdir",
			filepath.Join(e.WorkDir, fmt.Sprintf("run-%d", time.Now().UnixNano()))}
		if job.Mode.LANCC != "" {
			w = append(w, "--lan-cc", job.Mode.LANCC)
		}
		if job.Mode.WANCC != "" {
			w = append(w, "--wan-cc", job.Mode.WANCC)
		}
		if job.Mode.WANConns > 0 {
			w = append(w, "--wan-conns", strconv.Itoa(job.Mode.WANConns))
		}
		w = append(w, job.Mode.Args...)
		argv = append(w, argv...)
	case KindRelay:
		return nil, fmt.Errorf("mode %s: the relay chain runs only the ping-pong", job.Mode.Name)
	default:
		return nil, fmt.Errorf("mode %s: kind %q is not supported by the lab executor", job.Mode.Name, job.Mode.Kind)
	}
	return argv, nil
}

// Run implements Executor.
func (e *LabExecutor) Run(ctx context.Context, job Job) ([]byte, error) {
	if job.Mode.Kind == KindRelay {
		return e.runRelay(ctx, job)
	}
	argv, err := e.Command(job)
	if err != nil {
		return nil, err
	}
	if job.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, job.Timeout)
		defer cancel()
	}
	var meter *crossMeter
	if job.Cross {
		if err := e.startCross(job.Timeout); err != nil {
			return nil, err
		}
		defer func() { _, _ = e.Lab.StopCross() }()
		meter = startCrossMeter(e.Lab.CrossSent)
	}
	first, _ := e.hosts(job.Ranks)
	cmd := e.Lab.CommandContext(context.Background(), first[0], argv[0], argv[1:]...)
	cmd.Dir = e.WorkDir
	// After the result line: mpirun's own teardown, then in gateway modes
	// the wrapper stops the gateways and prints its summary.
	grace := 10 * time.Second
	if job.Mode.Kind == KindGateways {
		grace = 30 * time.Second
	}
	stalled0 := e.stalled()
	clock := &resultClock{w: e.Echo}
	out, err := RunCommand(ctx, cmd, clock, grace)
	if n := e.stalled() - stalled0; n > 0 {
		err = &LabStalled{Packets: n, Err: err}
	}
	if meter != nil {
		out = append(out, meter.stop(clock)...)
	}
	return out, err
}

// stalled reads the emulator's count of packets that left it a second or
// more late (0 when the stats cannot be read: the run then shows why).
func (e *LabExecutor) stalled() uint64 {
	st, err := e.Lab.Stats()
	if err != nil {
		return 0
	}
	return st.Stalled()
}

// startCross starts competing flows in both directions between the first
// two sites and gives them a second to fill the WAN queue.
func (e *LabExecutor) startCross(d time.Duration) error {
	sites := e.Lab.Sites()
	if len(sites) < 2 {
		return errors.New("competing traffic needs 2 sites")
	}
	if d <= 0 {
		d = 10 * time.Minute
	}
	for i, p := range [][2]string{{sites[0], sites[1]}, {sites[1], sites[0]}} {
		m := e.crossMix(d, i)
		if err := e.Lab.StartCross(p[0], p[1], &m); err != nil {
			_, _ = e.Lab.StopCross()
			return fmt.Errorf("competing traffic %s -> %s: %w", p[0], p[1], err)
		}
	}
	time.Sleep(time.Second)
	return nil
}

// Ports of the relay chain (gateways use 5000-5999: mpi5k run draws there).
const (
	relayServerPort = 7101
	relayHop2Port   = 7102
	relayHop1Port   = 7103
)

// gateway is the gateway host of site.
func (e *LabExecutor) gateway(site string) (string, error) {
	if h := e.Lab.Gateway(site); h != "" {
		return h, nil
	}
	return "", fmt.Errorf("site %s has no gateway host", site)
}

// runRelay is the plain relay chain baseline: a raw TCP ping-pong from the
// first node of site 1 to the first node of site 2 through socat on both
// sites' gateway hosts (node -> socat -> WAN -> socat -> node), the path the
// gateways take, with a plain user-space copy at each hop.
func (e *LabExecutor) runRelay(ctx context.Context, job Job) ([]byte, error) {
	if job.Workload != "pingpong" {
		return nil, fmt.Errorf("mode %s: the relay chain runs only the ping-pong", job.Mode.Name)
	}
	sites := e.Lab.Sites()
	client, server := e.Lab.Hosts(sites[0], false)[0], e.Lab.Hosts(sites[1], false)[0]
	gw1, err := e.gateway(sites[0])
	if err != nil {
		return nil, err
	}
	gw2, err := e.gateway(sites[1])
	if err != nil {
		return nil, err
	}
	addr := func(h string, port int) string { return fmt.Sprintf("%s:%d", e.Lab.Addr(h), port) }
	var started []*exec.Cmd
	defer func() {
		for _, c := range started {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
	}()
	start := func(host string, argv ...string) error {
		c := e.Lab.Command(host, argv[0], argv[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Dir = e.WorkDir
		if err := c.Start(); err != nil {
			return fmt.Errorf("start %s on %s: %w", argv[0], host, err)
		}
		started = append(started, c)
		return nil
	}
	if err := os.MkdirAll(e.WorkDir, 0o755); err != nil {
		return nil, err
	}
	if err := start(server, e.Mpi5k, "bench", "_tcpping", "--listen", addr(server, relayServerPort)); err != nil {
		return nil, err
	}
	// nodelay on both legs of each hop: socat would otherwise let Nagle
	// hold small messages back.
	if err := start(gw2, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=%s,reuseaddr,fork,nodelay", relayHop2Port, e.Lab.Addr(gw2)),
		"TCP:"+addr(server, relayServerPort)+",nodelay"); err != nil {
		return nil, err
	}
	if err := start(gw1, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=%s,reuseaddr,fork,nodelay", relayHop1Port, e.Lab.Addr(gw1)),
		"TCP:"+addr(gw2, relayHop2Port)+",nodelay"); err != nil {
		return nil, err
	}
	if job.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, job.Timeout)
		defer cancel()
	}
	reps := 20
	for i := 0; i+1 < len(job.Args); i++ {
		if job.Args[i] == "--scale" {
			if f, err := strconv.ParseFloat(job.Args[i+1], 64); err == nil {
				reps = max(1, int(20*f+0.5))
			}
		}
	}
	cmd := e.Lab.CommandContext(context.Background(), client, e.Mpi5k, "bench", "_tcpping",
		"--connect", addr(gw1, relayHop1Port), "--reps", strconv.Itoa(reps))
	cmd.Dir = e.WorkDir
	return RunCommand(ctx, cmd, e.Echo, 10*time.Second)
}
