package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/wrap"
)

func init() {
	register("run", "run an unmodified mpirun command line through the site gateways", runMain)
}

const runSynopsis = `usage: mpi5k run [flags] LAUNCHER [launcher arguments...]
       scripts/mpirun-wrap [flags] LAUNCHER [launcher arguments...]

mpi5k run runs an unmodified mpirun/mpiexec/srun command line through
per-site gateways: it finds the sites of the command's hosts, starts a
gateway on one host of each site, runs the command with the shim
preloaded, and stops the gateways. Its flags go before the launcher word.

`

func runMain(args []string) int { return runCmd(args, os.Stdout, os.Stderr) }

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("mpi5k run", pflag.ContinueOnError)
	fs.SetInterspersed(false) // everything from the launcher word on is the launcher's
	self, _ := os.Executable()
	bindir := filepath.Dir(self)
	c := wrap.Config{Stdout: stdout, Stderr: stderr}
	var (
		flavour  = fs.String("flavour", "", "MPI flavour ("+wrap.FlavourHelp()+"); detected from the launcher name by default")
		gateways = fs.StringArray("gateway", nil, "SITE=HOST[,HOST2...]: run SITE's gateway on HOST, and further gateways of the site on HOST2... (repeatable; default $MPI5K_GATEWAYS, else the last host of the site)")
		launcher = fs.String("launcher", "ssh", "command that runs a command on a host, e.g. oarsh")
		helpAdv  = fs.Bool("help-advanced", false, "list the advanced tuning flags of the gateways and exit")
	)
	fs.StringVar(&c.SitesFile, "sites", "", "FILE of \"<host-or-CIDR> <site>\" lines (default: Grid'5000 names <cluster>-<n>.<site>)")
	fs.StringVar(&c.MapFile, "map", "", "site map FILE in the documented format (docs/sitemap-format.md): sites, nets, hosts, each site's lan=/wan= and the ready= of a running gateway (default $MPI5K_SITE_MAP)")
	fs.BoolVar(&c.Dedicated, "dedicated-gateways", false, "gateway hosts run no ranks")
	fs.StringVar(&c.GatewayBin, "gateway-bin", filepath.Join(bindir, "mpi5k-gateway"), "path of mpi5k-gateway on the gateway hosts")
	fs.StringVar(&c.Preload, "preload", shimPath(bindir), "path of libmpi5k.so on the rank hosts")
	fs.StringVar(&c.NodeBin, "node-bin", self, "path of mpi5k on the rank hosts, which run 'mpi5k node' with --lan-transport mx")
	drawn := fmt.Sprintf(" (default: drawn per job in %d-%d, so concurrent jobs never share one)", wrap.PortsFrom, wrap.PortsTo)
	fs.Var(cli.Port(&c.LANPort), "lan-port", "gateway port for its site's ranks"+drawn)
	fs.Var(cli.Port(&c.WANPort), "wan-port", "gateway port for peer gateways"+drawn)
	fs.Var(cli.Port(&c.MetricsPort), "metrics-port", "gateway HTTP port for /ready and /metrics"+drawn)
	c.ReadyTimeout = wrap.DefaultConfig().ReadyTimeout
	fs.Var(cli.Duration{P: &c.ReadyTimeout}, "ready-timeout", "how long to wait for every WAN link")
	fs.StringVar(&c.StartWhen, "start-when", wrap.DefaultStartWhen, "when the launcher starts: "+wrap.StartPrimed+" (every WAN link up and its bulk links primed) or "+wrap.StartLinks+" (links up: MPI_Init overlaps priming)")
	fs.StringVar(&c.WorkDir, "workdir", "", "directory for the site map and gateway logs (default ~/.mpi5k/run-PID-TIME)")
	fs.BoolVar(&c.SharedFS, "shared-fs", false, "the workdir is visible on every host: do not copy the map")
	fs.StringVar(&c.TraceDir, "trace", "", "record the ranks' socket calls into DIR (see docs/tracing.md)")
	fs.StringVar(&c.SummaryJSON, "summary-json", "", "also write the gateway summary (bytes, streams, retransmissions per site pair; CPU per gateway; the launcher's status) as JSON to FILE")
	fs.BoolVar(&c.DryRun, "dry-run", false, "print the site map and every command, run nothing (resolves no names, writes no files)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the workdir (map, gateway logs) after the run")
	fs.BoolVar(&c.Plaintext, "wan-plaintext", false, "the job's gateways run without keys: the WAN leg unauthenticated and unencrypted (only for a WAN already protected, e.g. an IPsec tunnel between gateway hosts; docs/security.md)")
	gf := gateway.NewFlags(fs, true)
	cmd := cli.Command{Name: "mpi5k run", Stdout: stdout, Stderr: stderr, Help: func(w io.Writer) {
		visible := func(gw bool) func(*pflag.Flag) bool {
			return func(f *pflag.Flag) bool { return !f.Hidden && gf.Has(f.Name) == gw }
		}
		fmt.Fprintf(w, "%sflags:\n%s\ngateway flags, passed on to every gateway (mpi5k-gateway --help):\n%s\n"+
			"%d advanced gateway tuning flags: mpi5k run --help-advanced\n"+
			"environment: MPI5K_GATEWAYS, and MPI5K_LOG, MPI5K_FALLBACK, MPI5K_TRACE_SAMPLE passed\non to the ranks (docs/cli.md)\n%s",
			runSynopsis, cli.UsagesOf(fs, visible(false)), cli.UsagesOf(fs, visible(true)),
			strings.Count(cli.AdvancedUsages(fs), "\n"), cli.ExitStatusHelp(true))
	}}
	cmd.UnknownFlag = "mpi5k run's own flags come before the launcher, the launcher's after it: mpi5k run [flags] mpirun -np 4 ./app"
	if code, done := cmd.Parse(fs, args); done {
		return code
	}
	if *helpAdv {
		fmt.Fprintf(stdout, "advanced gateway flags of mpi5k run (defaults set by measurements; for experiments):\n%s", cli.AdvancedUsages(fs))
		return cli.ExitOK
	}
	c.Argv = fs.Args()
	if len(c.Argv) == 0 {
		return cmd.Usagef("no launcher command given, e.g. mpi5k run mpirun -np 4 --hostfile hosts ./app")
	}
	if *flavour != "" {
		f, err := wrap.ParseFlavour(*flavour)
		if err != nil {
			return cmd.Usagef("--flavour: %v", err)
		}
		c.Flavour = f
	}
	c.Gateways = map[string]string{}
	for _, g := range *gateways {
		if err := wrap.ParseGateways(c.Gateways, g); err != nil {
			return cmd.Usagef("--gateway: %v", err)
		}
	}
	c.Launcher = strings.Fields(*launcher)
	if len(c.Launcher) == 0 {
		return cmd.Usagef("--launcher is empty (default: ssh)")
	}
	ports := map[int]string{}
	for _, p := range []struct {
		flag string
		v    int
	}{{"--lan-port", c.LANPort}, {"--wan-port", c.WANPort}, {"--metrics-port", c.MetricsPort}} {
		if p.v == 0 {
			continue // drawn
		}
		if other, dup := ports[p.v]; dup {
			return cmd.Usagef("%s %d: %s is %d too; the gateway needs three different ports", p.flag, p.v, other, p.v)
		}
		ports[p.v] = p.flag
	}
	// The gateways' settings, checked together here so a mistake fails
	// before any gateway is started.
	gc, err := gf.Config()
	if err != nil {
		return cmd.Usagef("%v", err)
	}
	c.LANTransport, c.LANIf = gc.LANTransport, gc.LANIf
	c.GatewayArgs = gf.Args()
	for _, p := range []*string{&c.TraceDir, &c.WorkDir, &c.GatewayBin, &c.Preload, &c.MapFile, &c.NodeBin} {
		if *p != "" {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs
			}
		}
	}
	code, err := wrap.Run(context.Background(), c)
	if err != nil {
		fmt.Fprintf(stderr, "mpi5k run: %v\n", err)
		if code == cli.ExitUsage {
			fmt.Fprintf(stderr, "Run 'mpi5k run --help' for usage.\n")
		}
		if code == 0 {
			code = cli.ExitFailure
		}
	}
	return code
}
