package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/internal/logfmt"
	"github.com/mpi5k/mpi5k/node"
	"github.com/mpi5k/mpi5k/sitemap"
)

func init() {
	register("node", "the per-node daemon of --lan-transport mx: carries the node's ranks' streams to the gateway", func(args []string) int {
		return runNode(args, os.Stdout, os.Stderr)
	})
}

const nodeUsage = `usage: mpi5k node --map FILE --lan-if IF --listen 127.0.0.1:PORT [flags]

mpi5k node runs on each node of a site whose gateways use --lan-transport mx
(docs/architecture.md): it owns the node's MX engine on the LAN interface
(CAP_NET_RAW), takes the ranks' inter-site connections on a loopback port
(the shim connects there when MPI5K_NODE names it) and carries each as an MX
stream to one of the site's gateways (round robin over them, a gateway that
does not answer skipped), and connects the streams the gateways open to the
ranks' ports. 'mpi5k run --lan-transport mx' starts one per node host.

`

func runNode(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("mpi5k node", pflag.ContinueOnError)
	mapPath := fs.String("map", "", "site map file, docs/sitemap-format.md (required)")
	lanIf := fs.String("lan-if", "", "this node's interface on the site LAN, e.g. eth0 (required)")
	site := fs.String("site", "", "this node's site in the map (default: the site of --lan-if's address)")
	listen := fs.String("listen", "", "loopback address the ranks' shims connect to, the value of their MPI5K_NODE, e.g. 127.0.0.1:5070 (required)")
	def := node.DefaultConfig()
	maxConns := def.MaxConns
	fs.Var(cli.IntRange{P: &maxConns, Min: 1, Max: 1 << 20}, "max-conns", "connections carried at once, both directions; more are reset")
	resume := fs.Bool("resume", true, "ask for resumable connections, which outlive the gateway hosts that carry them when the far site's gateways deliver to node daemons too (docs/failures.md); --resume=false: plain streams")
	window, hold := def.ResumeWindow, def.Hold
	fs.Var(&cli.Size{P: &window, Min: 64 << 10, Max: 1 << 30}, "resume-window", "bytes a resumable connection keeps per direction until the far daemon acknowledges them: what it can resend, and the most it has in flight end to end")
	fs.Var(cli.Duration{P: &hold}, "resume-hold", "how long a resumable connection whose stream broke waits for another before its rank's socket is reset")
	logLevel := "info"
	fs.Var(cli.Choice{P: &logLevel, Words: []string{"debug", "info", "warn", "error"}}, "log-level", "debug, info, warn or error")
	logFormat := "auto"
	fs.Var(cli.Choice{P: &logFormat, Words: logfmt.Formats}, "log-format", "text, json, journal (text without times, each line led by its syslog priority), or auto: journal when stderr is systemd's journal, else text")
	showVersion := fs.Bool("version", false, "print the version and exit")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "exit when standard input closes (set by mpi5k run: a daemon started through ssh then dies with its launcher)")
	cmd := cli.Command{Name: "mpi5k node", Stdout: stdout, Stderr: stderr, Help: func(w io.Writer) {
		fmt.Fprint(w, nodeUsage, "flags:\n", fs.FlagUsages(), cli.ExitStatusHelp(false))
	}}
	if code, done := cmd.Parse(fs, args); done {
		return code
	}
	switch {
	case *showVersion:
		fmt.Fprintln(stdout, "mpi5k node", version)
		return cli.ExitOK
	case fs.NArg() > 0:
		return cmd.Usagef("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	case *mapPath == "" || *lanIf == "" || *listen == "":
		return cmd.Usagef("--map FILE, --lan-if IF and --listen 127.0.0.1:PORT are required")
	}
	ln, err := netip.ParseAddrPort(*listen)
	if err != nil || !ln.Addr().IsLoopback() || ln.Port() == 0 {
		return cmd.Usagef("--listen %q: want a loopback address and a port, e.g. 127.0.0.1:5070", *listen)
	}
	m, err := sitemap.Load(*mapPath)
	if err != nil {
		return cmd.Failf("--map: %v", err)
	}
	if *site != "" {
		if _, ok := m.Site(*site); !ok {
			return cmd.Usagef("--site %q is not a site of %s", *site, *mapPath)
		}
	}
	var level slog.Level
	level.UnmarshalText([]byte(logLevel)) // a word cli.Choice took
	log, err := logfmt.New(stderr, level, logFormat)
	if err != nil {
		return cmd.Usagef("--log-format: %v", err) // cli.Choice took the word
	}
	if hold <= 0 {
		return cmd.Usagef("--resume-hold %v: want a positive duration, e.g. 30s", hold)
	}
	cfg := node.Config{Listen: ln, MaxConns: maxConns, Log: log, NoResume: !*resume, ResumeWindow: window, Hold: hold}
	closeMX, err := node.Open(&cfg, *lanIf, m, *site)
	if err != nil {
		return cmd.Failf("%v", err)
	}
	defer closeMX()
	d, err := node.New(cfg)
	if err != nil {
		return cmd.Failf("%v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *stdinEOF {
		ctx = cli.StopOnStdinEOF(ctx, log, "exiting")
	}
	var gws, gwMX []string
	for _, g := range cfg.Gateways {
		gws, gwMX = append(gws, g.LAN.String()), append(gwMX, g.MX.String())
	}
	log.Info("node daemon ready", "listen", d.Addr().String(), "node", cfg.Addr.String(),
		"gateways", strings.Join(gws, ","), "gateways_mx", strings.Join(gwMX, ","))
	if err := d.Run(ctx); err != nil {
		log.Error("node daemon failed", "err", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}
