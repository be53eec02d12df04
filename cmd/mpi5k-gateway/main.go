// Command mpi5k-gateway is the per-site gateway daemon: it relays the
// site's inter-site connections over one aggregated WAN connection per site
// pair. All logic lives in package gateway; this file parses flags.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/units"
	"github.com/spf13/pflag"
)

var version = "dev"

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := pflag.NewFlagSet("mpi5k-gateway", pflag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: mpi5k-gateway --map FILE --site NAME [flags]\n\n%s", fs.FlagUsages())
	}
	mapPath := fs.String("map", "", "site map file (required)")
	site := fs.String("site", "", "this gateway's site name in the map (required)")
	lanCC := fs.String("lan-cc", "", "TCP congestion control on LAN sockets (e.g. cubic; default: system)")
	wanCC := fs.String("wan-cc", "", "TCP congestion control on WAN sockets (default: bbr if the kernel has it, else the system default)")
	lanSnd := fs.String("lan-sndbuf", "0", "SO_SNDBUF of LAN sockets (0: autotune; accepts KiB/MiB)")
	lanRcv := fs.String("lan-rcvbuf", "0", "SO_RCVBUF of LAN sockets")
	wanSnd := fs.String("wan-sndbuf", "0", "SO_SNDBUF of WAN sockets")
	wanRcv := fs.String("wan-rcvbuf", "0", "SO_RCVBUF of WAN sockets")
	lowat := fs.String("wan-notsent-lowat", "128KiB", "TCP_NOTSENT_LOWAT of WAN sockets")
	chunk := fs.String("chunk", "128KiB", "largest DATA frame on the WAN (≤ 1MiB)")
	window := fs.String("window", "4MiB", "per-stream receive window granted to peers (far-side memory bound: streams x window)")
	wanConns := fs.Int("wan-conns", 1, "parallel bulk WAN connections per site pair, large writes striped over them (same on every gateway)")
	express := fs.Bool("wan-express", true, "one more WAN connection per site pair for small frames only, so they never wait behind bulk (same on every gateway)")
	expressCC := fs.String("wan-express-cc", "", "congestion control of the express link (default: cubic; bbr, primed, holds up better against competing BBR flows but loses its estimate under random loss)")
	renew := fs.Bool("wan-express-renew", true, "replace the express link with a fresh connection when losses have cut its congestion window below one --express-max message (same on every gateway)")
	expressMax := fs.String("express-max", "68KiB", "largest message (burst of bytes a rank writes without pausing) that takes the express link; at most --chunk")
	wanPace := fs.String("wan-pace", "0", "cap each site pair's bulk WAN sending rate, e.g. 190mbit (0: no cap); a few percent below the WAN bottleneck keeps its queue empty")
	wanQueue := fs.Duration("wan-queue", time.Millisecond, "queue control: WAN bottleneck queue a saturating bulk link may keep, by capping the peer's receive window at measured rate x (min RTT + this); lifted while other flows fill the queue (0: off)")
	rtoMin := fs.Duration("wan-rto-min", 10*time.Millisecond, "floor of WAN sockets' retransmission timeout (TCP_RTO_MIN_US; 0: the kernel's 200 ms): a lost lone message then waits tens of ms, not 200+")
	delackMax := fs.Duration("wan-delack-max", 5*time.Millisecond, "longest a WAN socket delays an ACK (TCP_DELACK_MAX_US; 0: the kernel's 200 ms); bounds the peer's tail-loss probe delay")
	skipProbe := fs.Bool("wan-skip-probe-rtt", true, "idle a busy BBR bulk link for a few ms across its min_rtt filter's expiry, so BBR restarts from idle instead of cutting cwnd to 4 for 200 ms (PROBE_RTT) every 10 s of bulk")
	prime := fs.Bool("wan-prime", true, "fill each new BBR WAN link with filler (PAD frames, one link of a site pair at a time) until BBR has measured the path, so it does not pace messages at the rate of earlier small ones (no effect on CUBIC or Reno links)")
	keepWarm := fs.Bool("wan-keep-warm", true, "turn off TCP slow start after idle (net.ipv4.tcp_slow_start_after_idle) in this host's network namespace while the gateway runs, so the CUBIC express link keeps its window across an MPI job's pauses; restored at exit; not needed, and not done, when every WAN socket runs BBR")
	pollThread := fs.Bool("poll-thread", true, "forward small messages on one event-loop thread that waits for every idle socket (false: Go's network poller)")
	quietRT := fs.Bool("quiet-runtime", true, "while the poll thread waits for a socket, take its input out of Go's runtime epoll registration, so an arriving message wakes one thread, not two (false: leave the runtime's registration alone)")
	ready := fs.String("ready-file", "", "file written once every WAN link is up (and primed, see --wan-prime)")
	metrics := fs.String("metrics", "", "listen address of the HTTP server for /metrics and /ready (e.g. :9105)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version and exit")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "drain and exit when standard input closes (set by mpirun-wrap: a gateway started through ssh then dies with its launcher)")
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println("mpi5k-gateway", version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *mapPath == "" || *site == "" {
		fmt.Fprintln(os.Stderr, "mpi5k-gateway: --map and --site are required")
		fs.Usage()
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	sizes := map[string]*string{"lan-sndbuf": lanSnd, "lan-rcvbuf": lanRcv, "wan-sndbuf": wanSnd,
		"wan-rcvbuf": wanRcv, "wan-notsent-lowat": lowat, "chunk": chunk, "window": window, "express-max": expressMax}
	n := map[string]int{}
	for name, v := range sizes {
		x, err := units.Size(*v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mpi5k-gateway: --%s: %v\n", name, err)
			return 2
		}
		n[name] = x
	}
	if n["window"] < 1 || n["window"] > 1<<30 {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: --window %s out of range 1..1GiB\n", *window)
		return 2
	}
	pace, err := units.Rate(*wanPace)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: --wan-pace: %v\n", err)
		return 2
	}
	m, err := sitemap.Load(*mapPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: %v\n", err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	g, err := gateway.New(gateway.Config{
		Map: m, Site: *site,
		LAN: gateway.SockOpts{CC: *lanCC, SndBuf: n["lan-sndbuf"], RcvBuf: n["lan-rcvbuf"]},
		WAN: gateway.SockOpts{CC: *wanCC, SndBuf: n["wan-sndbuf"], RcvBuf: n["wan-rcvbuf"], NotSentLowat: n["wan-notsent-lowat"],
			RTOMin: *rtoMin, DelackMax: *delackMax},
		Chunk:           n["chunk"],
		Window:          uint32(n["window"]),
		WANConns:        *wanConns,
		NoExpress:       !*express,
		ExpressCC:       *expressCC,
		NoRenew:         !*renew,
		ExpressMax:      n["express-max"],
		WANPace:         pace,
		WANQueue:        *wanQueue,
		NoPollThread:    !*pollThread,
		NoQuietRuntime:  !*quietRT,
		NoProbeRTTGuard: !*skipProbe,
		NoPrime:         !*prime,
		KeepWarm:        *keepWarm,
		ReadyFile:       *ready,
		MetricsAddr:     *metrics,
		Logger:          log,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "mpi5k-gateway: %v\n", err)
		return 1
	}
	// SIGTERM/SIGINT: stop accepting, let streams drain, then exit.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *stdinEOF {
		// ssh gives a remote command no SIGHUP without a tty, but closes its
		// stdin when the local ssh ends: that is the launcher's last word.
		ctx = stopOnStdinEOF(ctx, log)
	}
	if err := g.Run(ctx); err != nil {
		log.Error("gateway failed", "err", err)
		return 1
	}
	return 0
}

func stopOnStdinEOF(parent context.Context, log *slog.Logger) context.Context {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		log.Info("standard input closed: draining and exiting")
		cancel()
	}()
	return ctx
}
