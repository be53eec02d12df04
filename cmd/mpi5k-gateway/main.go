// Command mpi5k-gateway is the per-site gateway daemon: it relays the
// site's inter-site connections over one aggregated WAN connection per site
// pair. All logic lives in package gateway (its flags in gateway/flags.go);
// this file parses the command line.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/mpi5k/mpi5k/doctor"
	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/internal/logfmt"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/spf13/pflag"
)

var version = "dev"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const synopsis = `usage: mpi5k-gateway --map FILE --site NAME [flags]

mpi5k-gateway is one site's gateway: it relays the site's connections to
other sites over one aggregated WAN connection per site pair. 'mpi5k run'
starts it on each site's gateway host with the same flags.

`

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("mpi5k-gateway", pflag.ContinueOnError)
	mapPath := fs.String("map", "", "site map file, docs/sitemap-format.md (required)")
	site := fs.String("site", "", "this gateway's site name in the map (required)")
	gf := gateway.NewFlags(fs, false)
	var lanAt, wanAt cli.AddrPort
	fs.Var(&lanAt, "lan", "this gateway's LAN listener, when the site map lists several gateways for its site: which of them this is (default: the one whose addresses are this host's)")
	fs.Var(&wanAt, "wan", "this gateway's WAN listener, when the site map lists several gateways for its site (with --lan)")
	key := fs.String("key", "", "this gateway's private key file, needed when the site map lists gateway keys (docs/security.md)")
	genKey := fs.String("gen-key", "", "write a new private key to FILE (mode 0600, never overwritten), print its public key for the site map, and exit")
	metrics := fs.String("metrics", "", "listen address of the HTTP server for /metrics and /ready, e.g. 127.0.0.1:9105 (a bare :9105 listens on loopback only)")
	ready := fs.String("ready-file", "", "file written once every WAN link is up (and primed)")
	logLevel := "info"
	fs.Var(cli.Choice{P: &logLevel, Words: []string{"debug", "info", "warn", "error"}}, "log-level", "debug, info, warn or error")
	logFormat := "auto"
	fs.Var(cli.Choice{P: &logFormat, Words: logfmt.Formats}, "log-format", "text, json, journal (text without times, each line led by its syslog priority), or auto: journal when stderr is systemd's journal, else text")
	showVersion := fs.Bool("version", false, "print the version and exit")
	helpAdv := fs.Bool("help-advanced", false, "list the advanced tuning flags and exit")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "drain and exit when standard input closes (set by mpi5k run: a gateway started through ssh then dies with its launcher)")
	cli.MarkAdvanced(fs, "exit-on-stdin-eof")
	readyTag := fs.String("ready-tag", "", "answer /ready?tag=X only for this X (set by mpi5k run, which draws one per job)")
	cli.MarkAdvanced(fs, "ready-tag")
	cmd := cli.Command{Name: "mpi5k-gateway", Stdout: stdout, Stderr: stderr, Help: func(w io.Writer) {
		fmt.Fprintf(w, "%sflags:\n%s\n%d advanced tuning flags: mpi5k-gateway --help-advanced\n%s",
			synopsis, fs.FlagUsages(), strings.Count(cli.AdvancedUsages(fs), "\n"), cli.ExitStatusHelp(false))
	}}
	if code, done := cmd.Parse(fs, args); done {
		return code
	}
	switch {
	case *showVersion:
		fmt.Fprint(stdout, cli.VersionText("mpi5k-gateway", version, doctor.Features(doctor.Local())))
		return cli.ExitOK
	case *helpAdv:
		fmt.Fprintf(stdout, "advanced flags of mpi5k-gateway (defaults set by measurements; for experiments):\n%s", cli.AdvancedUsages(fs))
		return cli.ExitOK
	case *genKey != "":
		pub, err := gateway.GenerateKey(*genKey)
		if err != nil {
			return cmd.Failf("--gen-key: %v", err)
		}
		name := *site
		if name == "" {
			name = "SITE"
		}
		fmt.Fprintln(stdout, sitemap.FormatKey(pub))
		fmt.Fprintf(stderr, "private key written to %s; list the public key in the site map of every gateway:\n  key %s %s\n",
			*genKey, name, sitemap.FormatKey(pub))
		return cli.ExitOK
	case fs.NArg() > 0:
		return cmd.Usagef("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	case *mapPath == "" || *site == "":
		return cmd.Usagef("--map FILE and --site NAME are required")
	}
	if *metrics != "" {
		if err := checkListenAddr(*metrics); err != nil {
			return cmd.Usagef("--metrics %q: %v", *metrics, err)
		}
	}
	cfg, err := gf.Config()
	if err != nil {
		return cmd.Usagef("%v", err)
	}
	m, err := sitemap.Load(*mapPath)
	if err != nil {
		return cmd.Failf("--map: %v", err)
	}
	if _, ok := m.Site(*site); !ok {
		return cmd.Usagef("--site %q: no such site in %s; its sites: %s (give one of them, or add the site to the map)",
			*site, *mapPath, siteNames(m))
	}
	var level slog.Level
	level.UnmarshalText([]byte(logLevel)) // a word cli.Choice took
	log, err := logfmt.New(stderr, level, logFormat)
	if err != nil {
		return cmd.Usagef("--log-format: %v", err) // cli.Choice took the word
	}
	cfg.Map, cfg.Site, cfg.ReadyFile, cfg.MetricsAddr, cfg.Logger = m, *site, *ready, *metrics, log
	gateway.Version = version
	cfg.ReadyTag = *readyTag
	cfg.KeyFile = *key
	cfg.ListenLAN, cfg.ListenWAN = lanAt.V, wanAt.V
	if cfg.Priority != 0 {
		if err := gateway.RaisePriority(cfg.Priority); err != nil {
			log.Warn("gateway keeps its inherited priority; ranks computing on this host may delay forwarding (see --priority)", "err", err)
		}
	}
	g, err := gateway.New(cfg)
	if err != nil {
		return cmd.Failf("%v", err)
	}
	// SIGTERM/SIGINT: stop accepting, let streams drain, then exit.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *stdinEOF {
		// ssh gives a remote command no SIGHUP without a tty, but closes its
		// stdin when the local ssh ends: that is the launcher's last word.
		ctx = cli.StopOnStdinEOF(ctx, log, "draining and exiting")
	} else {
		// A service gateway outlives its site map: SIGHUP (systemctl
		// reload) reads --map again. Under ssh, SIGHUP keeps its default.
		// Notify before Run, so that an early SIGHUP cannot kill the process.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go reloadOnHUP(ctx, hup, g, *mapPath, log)
	}
	go notifyReady(ctx, g, notifyWait, log)
	err = g.Run(ctx)
	notify(log, daemon.SdNotifyStopping)
	if err != nil {
		log.Error("gateway failed", "err", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// notifyWait is how long a gateway under systemd (Type=notify) waits for
// every WAN link before it reports ready all the same: a service gateway
// serves the sites that are up while others are down, and `systemctl
// start` must not wait for a site that is off (TimeoutStartSec is 90 s).
const notifyWait = 30 * time.Second

// notifyReady tells systemd (NOTIFY_SOCKET; nothing without it) that the
// gateway is ready once every WAN link is up, or after wait with a STATUS
// that says links are missing (/ready names them).
func notifyReady(ctx context.Context, g *gateway.Gateway, wait time.Duration, log *slog.Logger) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	notify(log, "STATUS=listening; waiting for every WAN link")
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-g.Ready():
		notify(log, daemon.SdNotifyReady+"\nSTATUS=serving; every WAN link up")
		return
	case <-t.C:
		notify(log, daemon.SdNotifyReady+"\nSTATUS=serving; not every WAN link is up yet (GET /ready names what is missing)")
	case <-ctx.Done():
		return
	}
	select {
	case <-g.Ready():
		notify(log, "STATUS=serving; every WAN link up")
	case <-ctx.Done():
	}
}

// notify sends state to systemd's notification socket, if there is one.
func notify(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("systemd notification not sent", "err", err, "state", state)
	}
}

// checkListenAddr checks a listen address (host:port, host optional)
// before anything starts.
func checkListenAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("want HOST:PORT or :PORT, e.g. :9105")
	}
	return cli.Port(new(int)).Set(port)
}

// reloadOnHUP reloads the site map on every SIGHUP until ctx ends. A map
// that does not parse, or that the gateway refuses, is logged with its
// reason and the map in force stays.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, g *gateway.Gateway, path string, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		notify(log, daemon.SdNotifyReloading)
		m, err := sitemap.Load(path)
		if err == nil {
			_, err = g.Reload(m) // Reload logs what changed
		}
		notify(log, daemon.SdNotifyReady)
		if err == nil {
			continue
		}
		log.Error("SIGHUP: site map not reloaded; the map in force stays", "map", path, "err", err,
			"fix", "correct the file (mpi5k sitemap check "+path+") and send SIGHUP again")
	}
}

// siteNames lists the map's sites, comma-separated, for an error message.
func siteNames(m *sitemap.Map) string {
	var names []string
	for _, s := range m.Sites() {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}
