package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/units"
	"github.com/mpi5k/mpi5k/wrap"
)

func init() {
	register("run", "run an unmodified mpirun command line through the site gateways", runMain)
}

func runMain(args []string) int {
	fs := pflag.NewFlagSet("mpi5k run", pflag.ContinueOnError)
	fs.SetInterspersed(false) // everything from the launcher word on is mpirun's
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: mpi5k run [flags] mpirun [mpirun arguments...]\n       scripts/mpirun-wrap [flags] mpirun [mpirun arguments...]\n\n")
		fs.PrintDefaults()
	}
	self, _ := os.Executable()
	bindir := filepath.Dir(self)
	var (
		c        wrap.Config
		flavour  = fs.String("flavour", "", "MPI flavour (openmpi, prrte, mpich, intel); detected from the launcher name by default")
		gateways = fs.StringArray("gateway", nil, "SITE=HOST: run SITE's gateway on HOST (repeatable; default $MPI5K_GATEWAYS, else the last host of the site)")
		launcher = fs.String("launcher", "ssh", "command that runs a command on a host, e.g. oarsh")
		lanCC    = fs.String("lan-cc", "", "congestion control of the gateways' LAN sockets")
		wanCC    = fs.String("wan-cc", "", "congestion control of the gateways' WAN sockets")
		xCC      = fs.String("wan-express-cc", "", "congestion control of the gateways' express links (gateway default: cubic)")
		xMax     = fs.String("express-max", "", "largest message the gateways send on the express link (gateway default: 68KiB)")
		wanConns = fs.Int("wan-conns", 0, "bulk WAN connections per site pair")
		express  = fs.Bool("wan-express", true, "an express WAN connection per site pair for messages")
		renew    = fs.Bool("wan-express-renew", true, "gateways replace an express link whose congestion window losses have cut below one message")
		pollThr  = fs.Bool("poll-thread", true, "gateways forward small messages of quiet connections on one event-loop thread")
		quietRT  = fs.Bool("quiet-runtime", true, "gateways keep Go's runtime from waking for input on sockets their event-loop thread waits for")
		skipRTT  = fs.Bool("wan-skip-probe-rtt", true, "gateways idle a busy BBR bulk link for a few ms across its min_rtt expiry instead of letting it dip into PROBE_RTT")
		prime    = fs.Bool("wan-prime", true, "gateways fill each new BBR WAN link with filler until BBR has measured the path")
		warm     = fs.Bool("wan-keep-warm", true, "gateways turn off TCP slow start after idle in their hosts' network namespaces while they run (keeps the express link's window across pauses)")
		chunk    = fs.String("chunk", "", "gateway chunk size, e.g. 128KiB")
		window   = fs.String("window", "", "per-stream window, e.g. 4MiB")
		wanPace  = fs.String("wan-pace", "", "cap each site pair's WAN rate, e.g. 950mbit for a 1 Gbit/s WAN (keeps its queue empty)")
		lowat    = fs.String("wan-notsent-lowat", "", "unsent bytes the gateways keep in a WAN socket, e.g. 32KiB")
		wanQueue = fs.String("wan-queue", "", "WAN bottleneck queue the gateways' bulk links keep while messages cross it (gateway default 1ms; 0: off)")
		rtoMin   = fs.String("wan-rto-min", "", "RTO floor of the gateways' WAN sockets (gateway default 10ms; 0: the kernel's 200 ms)")
		delack   = fs.String("wan-delack-max", "", "longest the gateways' WAN sockets delay an ACK (gateway default 5ms; 0: the kernel's)")
	)
	fs.StringVar(&c.SitesFile, "sites", "", "FILE of \"<host-or-CIDR> <site>\" lines (default: Grid'5000 names <cluster>-<n>.<site>)")
	fs.BoolVar(&c.Dedicated, "dedicated-gateways", false, "gateway hosts run no ranks")
	fs.StringVar(&c.GatewayBin, "gateway-bin", filepath.Join(bindir, "mpi5k-gateway"), "path of mpi5k-gateway on the gateway hosts")
	fs.StringVar(&c.Preload, "preload", shimPath(bindir), "path of libmpi5k.so on the rank hosts")
	fs.IntVar(&c.LANPort, "lan-port", 5000, "gateway port for its site's ranks")
	fs.IntVar(&c.WANPort, "wan-port", 5001, "gateway port for peer gateways")
	fs.IntVar(&c.MetricsPort, "metrics-port", 5002, "gateway HTTP port for /ready and /metrics")
	fs.DurationVar(&c.ReadyTimeout, "ready-timeout", 0, "how long to wait for every WAN link (default 30s)")
	fs.StringVar(&c.WorkDir, "workdir", "", "directory for the site map and gateway logs (default ~/.mpi5k/run-PID-TIME)")
	fs.BoolVar(&c.SharedFS, "shared-fs", false, "the workdir is visible on every host: do not copy the map")
	fs.StringVar(&c.TraceDir, "trace", "", "record the ranks' socket calls into DIR (see docs/trace-format.md)")
	fs.BoolVar(&c.DryRun, "dry-run", false, "print the site map and every command, run nothing")
	fs.BoolVar(&c.Keep, "keep", false, "keep the workdir (map, gateway logs) after the run")
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		return 2
	}
	c.Argv = fs.Args()
	if len(c.Argv) == 0 {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "mpi5k run: %v\n", err)
		return 2
	}
	if *flavour != "" {
		f, err := wrap.ParseFlavour(*flavour)
		if err != nil {
			return fail(err)
		}
		c.Flavour = f
	}
	c.Gateways = map[string]string{}
	for _, g := range *gateways {
		if err := wrap.ParseGateways(c.Gateways, g); err != nil {
			return fail(fmt.Errorf("--gateway: %v", err))
		}
	}
	c.Launcher = strings.Fields(*launcher)
	if len(c.Launcher) == 0 {
		return fail(fmt.Errorf("--launcher is empty"))
	}
	// Checked here so a typo fails before any gateway is started.
	if *wanPace != "" {
		if _, err := units.Rate(*wanPace); err != nil {
			return fail(fmt.Errorf("--wan-pace: %v", err))
		}
	}
	for name, v := range map[string]string{"--wan-queue": *wanQueue, "--wan-rto-min": *rtoMin, "--wan-delack-max": *delack} {
		if d, err := time.ParseDuration(v); v != "" && (err != nil || d < 0) {
			return fail(fmt.Errorf("%s: bad duration %q (want e.g. 1ms, or 0 for off)", name, v))
		}
	}
	for name, v := range map[string]string{"--chunk": *chunk, "--window": *window, "--wan-notsent-lowat": *lowat, "--express-max": *xMax} {
		if v == "" {
			continue
		}
		if _, err := units.Size(v); err != nil {
			return fail(fmt.Errorf("%s: %v", name, err))
		}
	}
	for _, kv := range [][2]string{{"--lan-cc", *lanCC}, {"--wan-cc", *wanCC}, {"--wan-express-cc", *xCC}, {"--express-max", *xMax}, {"--chunk", *chunk}, {"--window", *window},
		{"--wan-pace", *wanPace}, {"--wan-notsent-lowat", *lowat}, {"--wan-queue", *wanQueue}, {"--wan-rto-min", *rtoMin}, {"--wan-delack-max", *delack}} {
		if kv[1] != "" {
			c.GatewayArgs = append(c.GatewayArgs, kv[0], kv[1])
		}
	}
	if *wanConns > 0 {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-conns", fmt.Sprint(*wanConns))
	}
	if !*pollThr {
		c.GatewayArgs = append(c.GatewayArgs, "--poll-thread=false")
	}
	if !*quietRT {
		c.GatewayArgs = append(c.GatewayArgs, "--quiet-runtime=false")
	}
	if !*renew {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-express-renew=false")
	}
	if !*skipRTT {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-skip-probe-rtt=false")
	}
	if !*warm {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-keep-warm=false")
	}
	if !*prime {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-prime=false")
	}
	if !*express {
		c.GatewayArgs = append(c.GatewayArgs, "--wan-express=false")
	}
	for _, p := range []*string{&c.TraceDir, &c.WorkDir, &c.GatewayBin, &c.Preload} {
		if *p != "" {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs
			}
		}
	}
	code, err := wrap.Run(context.Background(), c)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k run: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
