package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/testbed"
	"github.com/mpi5k/mpi5k/units"
	"github.com/spf13/pflag"
)

func init() {
	register("lab", "build and drive the emulated multi-site grid (up, exec, hosts, cross, stats, down)", runLab)
}

const labUsage = `usage: mpi5k lab <subcommand> [--name L] [flags]

  up      build a lab:  --sites 2|lyon,rennes --nodes 2 --rtt 20ms --wan-rate 200mbit
          [--lan-rate 1gbit] [--loss 0.1%] [--jitter 1ms] [--reorder 1% [--reorder-delay 5ms]]
          [--seed N] [--queue 1bdp|BYTES] [--mtu 1500] [--cross-mtu 9000] [--lan-loss 1%|SITE=1%,...]
          [--lan-reorder 1%|SITE=1%,... [--lan-reorder-delay 5ms]]
          [--gateway-nics 1|2] [--gateways 1..8 (gateway hosts per site: gw, gw2, ...)]
          [--host-cc cubic|reno|bbr|system (hosts' default TCP; one the kernel does not allow
          namespaces is added to net.ipv4.tcp_allowed_congestion_control while a lab needs it)]
          [--matrix FILE (per-pair rtt/rate/loss; sets the sites)]
  exec    run a command inside a lab host:  mpi5k lab exec HOST -- CMD ARGS...
  hosts   list host names:  [--site S] [--gateways]
  cross   competing TCP flows:  --from S1 --to S2 [--flows 1] [--duration 60s]
          [--cc cubic,bbr (one for all flows, or one per flow)] [--pattern bulk|onoff|bulk,onoff]
          [--mean-size 2MiB] [--mean-gap 200ms] [--shape 1.5] [--seed N] (onoff: Pareto sizes,
          exponential gaps) | --stop
  stats   WAN counters per pair and direction  [--json] [--pairs: the per-pair table only]
  tamper  a man in the middle: flip a bit in every Nth WAN data segment of a port's flows
          (checksum fixed):  --every N [--count N] [--port 5001] [--pair S1,S2] | --stop
  down    remove everything the lab made (idempotent)

Every subcommand takes --name L (default mpi5k).
`

func runLab(args []string) int {
	sub, rest, code, done := cli.Subcommand(args, labUsage, os.Stdout, os.Stderr)
	if done {
		return code
	}
	var err error
	switch sub {
	case "up":
		err = labUp(rest)
	case "down":
		err = labDown(rest)
	case "exec":
		err = labExec(rest)
	case "hosts":
		err = labHosts(rest)
	case "cross":
		err = labCross(rest)
	case "stats":
		err = labStats(rest)
	case "tamper":
		err = labTamper(rest)
	// Hidden: the emulator daemon, the namespace entry helper, the ssh agent.
	case "_emu":
		err = labInternal(rest, func(name string, _ []string) error { return testbed.RunEmulator(name) })
	case "_enter":
		err = labInternal(rest, func(name string, a []string) error {
			if len(a) < 3 || a[1] != "--" {
				return errors.New("usage: mpi5k lab _enter --name L HOST -- CMD ARGS...")
			}
			return testbed.Enter(name, a[0], a[2:])
		})
	case "_onoff":
		err = labOnOff(rest)
	case "_sink":
		err = labSink(rest)
	case "_ssh":
		// ssh options must not be parsed as ours: only a leading --name.
		name := testbed.DefaultName
		if len(rest) >= 2 && rest[0] == "--name" {
			name, rest = rest[1], rest[2:]
		}
		err = testbed.EnterSSH(name, rest)
	default:
		fmt.Fprintf(os.Stderr, "mpi5k lab: unknown subcommand %q\nRun 'mpi5k lab --help' for usage.\n", sub)
		return cli.ExitUsage
	}
	cmd := cli.Command{Name: "mpi5k lab " + sub, Stdout: os.Stdout, Stderr: os.Stderr}
	var help labHelp
	var usage labUsageError
	switch {
	case errors.As(err, &help):
		fmt.Fprintf(os.Stdout, "%s\nflags of mpi5k lab %s:\n%s%s", labUsage, sub, help.flags, cli.ExitStatusHelp(false))
		return cli.ExitOK
	case errors.As(err, &usage):
		return cmd.Usagef("%v", usage.error)
	case err != nil:
		return cmd.Failf("%v", err)
	}
	return cli.ExitOK
}

// labHelp is --help given to a lab subcommand: its flags' usage.
type labHelp struct{ flags string }

func (labHelp) Error() string { return "help requested" }

// labUsageError is a wrong lab command line (exit status 2).
type labUsageError struct{ error }

// parseLab parses a lab subcommand's flags, telling --help and command-line
// mistakes apart from the subcommand's own failures.
func parseLab(fs *pflag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return labHelp{fs.FlagUsages()}
	}
	if err != nil {
		return labUsageError{err}
	}
	return nil
}

func labFlags(sub string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet("mpi5k lab "+sub, pflag.ContinueOnError)
	name := fs.String("name", testbed.DefaultName, "lab name")
	return fs, name
}

func labInternal(args []string, fn func(string, []string) error) error {
	fs, name := labFlags("internal")
	fs.SetInterspersed(false)
	if err := parseLab(fs, args); err != nil {
		return err
	}
	return fn(*name, fs.Args())
}

// parseNoArgs parses a subcommand's flags; none takes positional arguments.
func parseNoArgs(fs *pflag.FlagSet, args []string) error {
	if err := parseLab(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return labUsageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}

// parseOpen parses flags and attaches to the running lab they name.
func parseOpen(fs *pflag.FlagSet, name *string, args []string) (*testbed.Lab, error) {
	if err := parseNoArgs(fs, args); err != nil {
		return nil, err
	}
	return testbed.Open(*name)
}

func labUp(args []string) error {
	fs, name := labFlags("up")
	sites := fs.String("sites", "2", "number of sites, or comma-separated site names")
	nodes := fs.Int("nodes", 2, "compute hosts per site")
	rtt := fs.Duration("rtt", 20*time.Millisecond, "round-trip time between sites")
	wanRate := fs.String("wan-rate", "200mbit", "WAN rate per direction (e.g. 200mbit, 1gbit, 0 = unlimited)")
	lanRate := fs.String("lan-rate", "0", "LAN link rate (TBF), 0 = unlimited")
	lanLoss := fs.String("lan-loss", "0", "random loss of frames crossing a site's LAN: 1% for every site, or site1=1%,site2=0.5% (nftables; not seeded)")
	lanReorder := fs.String("lan-reorder", "0", "fraction of IPv4 packets entering a site's LAN held back --lan-reorder-delay so later ones overtake them: 1% or site1=1%,... (not seeded)")
	lanReorderDelay := fs.Duration("lan-reorder-delay", 0, "how long --lan-reorder holds a packet back (0..1s; default "+testbed.DefaultReorderDelay.String()+" when --lan-reorder is set)")
	loss := fs.String("loss", "0", "random loss per direction (e.g. 0.1%)")
	jitter := fs.Duration("jitter", 0, "one-way delay jitter (+-, never reorders: see --reorder)")
	reorder := fs.String("reorder", "0", "fraction of WAN packets held back --reorder-delay so later ones overtake them (e.g. 1%)")
	reorderDelay := fs.Duration("reorder-delay", 0, "how long --reorder holds a packet back (0..1s; default "+testbed.DefaultReorderDelay.String()+" when --reorder is set)")
	seed := fs.Uint64("seed", 0, "seed of the emulator's random loss, jitter and reordering: the same seed repeats the same choices (0 picks one and prints it)")
	queue := fs.String("queue", "1bdp", "WAN queue: 1bdp or a size in bytes (256k, 1m)")
	mtu := fs.Int("mtu", 1500, "MTU of every lab link")
	crossMTU := fs.Int("cross-mtu", 0, "MTU of the traffic hosts (lab cross), up to 9000 (0: --mtu): competing flows in jumbo frames cost the user-space WAN emulator a sixth of the packets, so a small machine carries them beside a job; nodes and gateways keep --mtu")
	gwNICs := fs.Int("gateway-nics", 1, "gateway interfaces: 1 (LAN) or 2 (LAN + WAN leg)")
	gateways := fs.Int("gateways", 1, fmt.Sprintf("gateway hosts per site, 1..%d: gw.<site>, gw2.<site>, ... each listed in the site map and $MPI5K_GATEWAYS, so mpi5k run starts a gateway on every one", testbed.MaxGateways))
	hostCC := fs.String("host-cc", "system", "default TCP congestion control of the lab's hosts, e.g. cubic (Linux's default, what cluster nodes run) or reno; system keeps the machine's. One missing from net.ipv4.tcp_allowed_congestion_control is added while a lab uses it")
	matrix := fs.String("matrix", "", "distance matrix file: per-pair rtt, rate, loss, jitter, queue (testbed/README.md); its sites replace --sites, its pairs override the flags")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	// Every mistake in these flags is a usage error.
	c, err := func() (testbed.Config, error) {
		c := testbed.Config{Name: *name, Nodes: *nodes, RTT: *rtt, Jitter: *jitter, MTU: *mtu, CrossMTU: *crossMTU, GatewayNICs: *gwNICs, HostCC: *hostCC,
			ReorderDelay: *reorderDelay, Seed: *seed, Gateways: *gateways}
		var err error
		if *matrix != "" && fs.Changed("sites") {
			return c, fmt.Errorf("--sites and --matrix both given: the matrix file names the sites (drop --sites, or list the sites on the file's `sites` line)")
		}
		if c.Sites, err = testbed.ParseSites(*sites); err != nil {
			return c, err
		}
		if *nodes < 1 {
			return c, fmt.Errorf("--nodes: need at least 1, got %d", *nodes)
		}
		if *rtt < 0 {
			return c, fmt.Errorf("--rtt: negative %v", *rtt)
		}
		if *jitter < 0 {
			return c, fmt.Errorf("--jitter: negative %v", *jitter)
		}
		if *gwNICs != 1 && *gwNICs != 2 {
			return c, fmt.Errorf("--gateway-nics: must be 1 or 2, got %d", *gwNICs)
		}
		if *gateways < 1 || *gateways > testbed.MaxGateways {
			return c, fmt.Errorf("--gateways: need 1..%d gateway hosts per site, got %d", testbed.MaxGateways, *gateways)
		}
		if c.WANRate, err = testbed.ParseRate("wan-rate", *wanRate); err != nil {
			return c, err
		}
		if c.LANRate, err = testbed.ParseRate("lan-rate", *lanRate); err != nil {
			return c, err
		}
		if c.Loss, err = testbed.ParseLoss(*loss); err != nil {
			return c, err
		}
		if c.Reorder, err = testbed.ParseFraction("reorder", *reorder); err != nil {
			return c, err
		}
		if *reorderDelay < 0 || *reorderDelay > time.Second {
			return c, fmt.Errorf("--reorder-delay: %v out of range 0..1s", *reorderDelay)
		}
		if fs.Changed("reorder-delay") && c.Reorder == 0 && *matrix == "" {
			return c, fmt.Errorf("--reorder-delay %v given without --reorder (add e.g. --reorder 1%%, or drop it)", *reorderDelay)
		}
		if c.LANLoss, c.SiteLANLoss, err = testbed.ParseLANLoss(*lanLoss); err != nil {
			return c, err
		}
		if c.LANReorder, c.SiteLANReorder, err = testbed.ParseSiteFractions("lan-reorder", *lanReorder); err != nil {
			return c, err
		}
		c.LANReorderDelay = *lanReorderDelay
		if c.Queue, err = testbed.ParseQueue(*queue, c.WANRate, c.RTT, c.LinkMTU()); err != nil {
			return c, err
		}
		if *matrix != "" {
			def := testbed.PairLink{RTT: c.RTT, Jitter: c.Jitter, Rate: c.WANRate, Loss: c.Loss, Reorder: c.Reorder, ReorderDelay: c.ReorderDelay}
			if fs.Changed("queue") {
				def.Queue = c.Queue // else each pair gets 1 BDP of its own
			}
			m, err := testbed.ParseMatrixFile(*matrix, def)
			if err != nil {
				return c, err
			}
			c.Sites, c.Pairs = m.Sites, m.Pairs
		}
		// The rest of the checks, before anything is built; Normalize
		// names the field as the flag is named.
		if err := c.Normalize(); err != nil {
			return c, fmt.Errorf("--%w", err)
		}
		return c, nil
	}()
	if err != nil {
		return labUsageError{err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	l, err := testbed.Up(ctx, c)
	if err != nil {
		return err
	}
	for _, n := range l.Notes() {
		fmt.Println(n)
	}
	cfg := l.Config()
	rttText := cfg.RTT.String()
	if len(cfg.Pairs) > 0 {
		rttText = "per pair, unlisted " + rttText
	}
	fmt.Printf("lab %s up: %d sites x %d nodes, rtt %s (path cost %v measured, one-way delay set %v), wan %s, queue %d B, loss %g%%, host tcp %s\n",
		l.Name(), len(cfg.Sites), cfg.Nodes, rttText, l.PathCost().Round(time.Microsecond),
		l.OneWayDelay().Round(time.Microsecond), rateString(cfg.WANRate), cfg.Queue, cfg.Loss*100, cfg.HostTCP())
	if cfg.Reorder > 0 {
		fmt.Printf("reorder: %g%% of WAN packets held back %v\n", cfg.Reorder*100, cfg.ReorderDelay)
	}
	for _, site := range cfg.Sites {
		if f := cfg.SiteLANLossOf(site); f > 0 {
			fmt.Printf("LAN of %s: %g%% of frames dropped\n", site, f*100)
		}
		if f := cfg.SiteLANReorderOf(site); f > 0 {
			fmt.Printf("LAN of %s: %g%% of IPv4 packets held back %v\n", site, f*100, cfg.LANReorderDelay)
		}
	}
	if n := cfg.GatewaysPerSite(); n > 1 {
		fmt.Printf("%d gateway hosts per site: %s, ... (mpi5k run starts a gateway on each)\n", n, strings.Join(l.Gateways(cfg.Sites[0]), ", "))
	}
	fmt.Printf("seed %d (repeat the random choices with --seed %d)\n", cfg.Seed, cfg.Seed)
	if len(cfg.Pairs) > 0 {
		fmt.Printf("per-pair WAN (%d pairs from %s):\n", len(cfg.Pairs), *matrix)
		for _, p := range cfg.Pairs {
			fmt.Printf("  %-12s %-12s rtt %-8v wan %-16s loss %g%%  jitter %v  reorder %g%% by %v  queue %d B\n",
				p.A, p.B, p.RTT, rateString(p.Rate), p.Loss*100, p.Jitter, p.Reorder*100, p.ReorderDelay, p.Queue)
		}
	}
	fmt.Printf("site map: %s\nhosts: mpi5k lab hosts --name %s --gateways\n", l.SiteMapPath(), l.Name())
	return nil
}

func rateString(r uint64) string {
	if r == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%g Mbit/s", float64(r)/1e6)
}

func labDown(args []string) error {
	fs, name := labFlags("down")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	notes, err := testbed.DownNotes(*name)
	for _, n := range notes {
		fmt.Println(n)
	}
	return err
}

func labExec(args []string) error {
	fs, name := labFlags("exec")
	fs.SetInterspersed(false)
	if err := parseLab(fs, args); err != nil {
		return err
	}
	a := fs.Args()
	if len(a) >= 2 && a[1] == "--" {
		a = append(a[:1:1], a[2:]...)
	}
	if len(a) < 2 {
		return labUsageError{errors.New("want HOST -- CMD ARGS...")}
	}
	l, err := testbed.Open(*name)
	if err != nil {
		return err
	}
	if !l.Addr(a[0]).IsValid() && l.SiteOf(a[0]) == "" {
		return fmt.Errorf("lab %s has no host %q (see `mpi5k lab hosts --name %s --gateways`)", *name, a[0], *name)
	}
	return testbed.Enter(*name, a[0], a[1:])
}

func labHosts(args []string) error {
	fs, name := labFlags("hosts")
	site := fs.String("site", "", "only this site")
	gws := fs.Bool("gateways", false, "include the gateways")
	l, err := parseOpen(fs, name, args)
	if err != nil {
		return err
	}
	if *site != "" && !slices.Contains(l.Sites(), *site) {
		return fmt.Errorf("--site: lab %s has no site %q (sites: %s)", *name, *site, strings.Join(l.Sites(), ", "))
	}
	for _, h := range l.Hosts(*site, *gws) {
		fmt.Println(h)
	}
	return nil
}

func labCross(args []string) error {
	fs, name := labFlags("cross")
	from := fs.String("from", "", "site sending the flows")
	to := fs.String("to", "", "site receiving the flows")
	flows := fs.Int("flows", 0, "number of TCP flows (default: as many as --cc or --pattern list, else 1)")
	dur := fs.Duration("duration", 60*time.Second, "how long the flows run")
	cc := fs.String("cc", "", "congestion control of the flows: one for all (cubic) or one per flow (cubic,bbr); default the hosts'")
	pattern := fs.String("pattern", testbed.PatternBulk, "bulk (one iperf3 flow for the whole run) or onoff (transfers of Pareto sizes, each on a new connection, with exponential gaps); one for all or one per flow (bulk,onoff)")
	meanSize := fs.String("mean-size", "2MiB", "onoff: mean transfer size (Pareto)")
	meanGap := fs.Duration("mean-gap", testbed.DefaultMeanGap, "onoff: mean pause between transfers (exponential)")
	shape := fs.Float64("shape", testbed.DefaultShape, "onoff: Pareto shape of the sizes, > 1; nearer 1 is heavier-tailed")
	seed := fs.Uint64("seed", 0, "onoff: seed of the sizes and pauses (flow i uses seed+i); 0 picks one and prints it")
	stop := fs.Bool("stop", false, "stop all running cross traffic")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *stop {
		l, err := testbed.Open(*name)
		if err != nil {
			return err
		}
		n, err := l.StopCross()
		if err == nil {
			fmt.Printf("stopped %d cross-traffic processes\n", n)
		}
		return err
	}
	if *from == "" || *to == "" {
		return labUsageError{errors.New("--from and --to are required (or --stop)")}
	}
	m := testbed.CrossMix{Flows: *flows, CC: testbed.ParseCrossList(*cc), Pattern: testbed.ParseCrossList(*pattern),
		MeanGap: *meanGap, Shape: *shape, Seed: *seed, Duration: *dur}
	if fs.Changed("flows") && *flows == 0 {
		return labUsageError{errors.New("--flows: need at least 1, got 0")}
	}
	var err error
	if m.MeanSize, err = units.Size(*meanSize); err != nil {
		return labUsageError{fmt.Errorf("--mean-size: %w", err)}
	}
	if err := m.Normalize(); err != nil {
		return labUsageError{err}
	}
	l, err := testbed.Open(*name)
	if err != nil {
		return err
	}
	if err := l.StartCross(*from, *to, &m); err != nil {
		return err
	}
	fmt.Printf("%s %s -> %s for %v (logs in %s); stop with: mpi5k lab cross --name %s --stop\n",
		m.String(), *from, *to, *dur, l.CrossLogDir(), *name)
	return nil
}

// labOnOff is the client of an on/off competing flow, run by lab cross
// inside a traffic host.
func labOnOff(args []string) error {
	fs, _ := labFlags("_onoff")
	var o testbed.OnOff
	fs.StringVar(&o.Addr, "to", "", "sink address")
	fs.StringVar(&o.CC, "cc", "", "congestion control")
	fs.IntVar(&o.MeanSize, "mean-size", testbed.DefaultMeanSize, "mean transfer size, bytes")
	fs.DurationVar(&o.MeanGap, "mean-gap", testbed.DefaultMeanGap, "mean pause")
	fs.Float64Var(&o.Shape, "shape", testbed.DefaultShape, "Pareto shape")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed")
	fs.DurationVar(&o.Duration, "duration", time.Minute, "run time")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	return o.Run(os.Stdout)
}

// labSink is the server of on/off flows.
func labSink(args []string) error {
	fs, _ := labFlags("_sink")
	addr := fs.String("listen", "", "address to listen on")
	dur := fs.Duration("duration", time.Minute, "how long to accept")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	return testbed.RunSink(*addr, *dur)
}

func labTamper(args []string) error {
	fs, name := labFlags("tamper")
	every := fs.Uint64("every", 0, "flip a bit in every Nth data segment, counted per direction (1: each)")
	count := fs.Uint64("count", 0, "stop after this many flips per direction (0: no limit)")
	port := fs.Uint16("port", testbed.GatewayWANPort, "TCP port whose flows to alter (default: the gateways' WAN port)")
	pair := fs.String("pair", "", "the two sites whose link to alter, S1,S2 (default: every pair)")
	stop := fs.Bool("stop", false, "stop altering packets")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	t := testbed.Tamper{Port: *port, Every: *every, Count: *count}
	switch {
	case *stop:
		t = testbed.Tamper{}
	case *every == 0:
		return labUsageError{errors.New("--every N is required (or --stop)")}
	}
	if *pair != "" {
		a, b, ok := strings.Cut(*pair, ",")
		if !ok || a == "" || b == "" {
			return labUsageError{fmt.Errorf("--pair %q: want two sites, e.g. --pair site1,site2", *pair)}
		}
		t.A, t.B = a, b
	}
	l, err := testbed.Open(*name)
	if err != nil {
		return err
	}
	if err := l.Tamper(t); err != nil {
		return err
	}
	if *stop {
		fmt.Println("tampering stopped")
	} else {
		fmt.Printf("flipping a bit in 1 of every %d data segments of port %d's flows; see mpi5k lab stats --name %s\n", *every, *port, *name)
	}
	return nil
}

func labStats(args []string) error {
	fs, name := labFlags("stats")
	asJSON := fs.Bool("json", false, "print JSON")
	pairsOnly := fs.Bool("pairs", false, "print only the per-pair table")
	l, err := parseOpen(fs, name, args)
	if err != nil {
		return err
	}
	s, err := l.Stats()
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(&s)
	}
	if *pairsOnly {
		s.WritePairs(os.Stdout)
		return nil
	}
	s.WriteText(os.Stdout)
	return nil
}
