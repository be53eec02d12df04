// Package gateway is the mpi5k site gateway: it accepts the site's nodes on
// the LAN (shims open relayed connections with one OPEN frame, or ask who
// stands behind a relayed connection with PEER_QUERY), keeps a full mesh of
// WAN links (package relay) to every other site's gateway, and applies the
// policy that makes it never an open relay. cmd/mpi5k-gateway is a thin main
// around Gateway.
//
// Where each concern lives:
//   - gateway.go: the Gateway, New, Run (start, drain, stop).
//   - config.go: Config, DefaultConfig (what the measurements settled) and
//     Validate; flags.go declares the same settings once as command-line
//     flags for mpi5k-gateway and `mpi5k run`.
//   - mesh.go: the WAN mesh: the site with the lower id dials each link and
//     redials after a failure, the acceptor admits only the site map's
//     gateways, express link renewal, readiness. A peer is one gateway
//     host of another site: every gateway pair keeps its own links.
//   - identity.go: which of its site's gateway hosts this gateway is.
//   - serve.go: the LAN side: OPEN and PEER_QUERY from the site's nodes, the
//     destination policy (destinations must be in this site and not a
//     gateway), streams opened from the WAN, the record of relayed peers.
//   - limits.go: the caps on streams, connections and pending handshakes
//     (docs/limits.md); admit.go: which pending WAN connections are taken
//     before they authenticate (per-source pools, random early drop).
//   - lan.go: the LAN transport interface.
//   - tcpevents.go, metrics.go: TCP_INFO sampling of the WAN links and the
//     /metrics and /ready endpoints.
//   - reload.go: a new site map in force while streams run (service mode);
//     degraded.go: what the gateway runs without (the reasons and their
//     sentences are package gateway/degraded, which mpi5k run's summary
//     reads too).
//
// The multiplexing itself (streams, trunks, queue control, the poller
// thread) is package relay; the WAN tuning policies the gateway applies to
// its sockets and links (socket options, congestion control, priming, the
// PROBE_RTT guard, keeping links warm) are package tuning.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/gateway/degraded"
	"github.com/mpi5k/mpi5k/internal/ratelog"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tuning"
)

// Gateway is one site's gateway.
type Gateway struct {
	cfg   Config
	site  *sitemap.Site
	log   *slog.Logger
	rcfg  relay.Config
	lan   LANTransport
	peers map[peerID]*peer // by site id and gateway index
	// gw is which of its site's gateway hosts this is (site.Gateways), me
	// its listeners.
	gw int
	me sitemap.Gateway
	// spread turns the tie-break of pickLink round robin.
	spread atomic.Uint32
	// auth authenticates WAN links and keys their records (nil: a keyless map);
	// acceptTLS is its server configuration.
	auth      *peerAuth
	acceptTLS *tls.Config

	lanLn LANListener
	wanLn *net.TCPListener

	peersMu sync.Mutex // guards peer.links and readiness
	ready   bool
	readyc  chan struct{}
	priming int // links being primed (tuning.Prime); readiness waits for them

	records  peerTable
	listens  listenTable // ranks' listening ports (LISTEN, listeners.go)
	m        *metrics
	guard    *tuning.ProbeGuard
	draining atomic.Bool // SIGTERM: refuse new streams from peers

	// smap is the site map in force (Reload replaces it; peersMu orders
	// it with peers). reloadMu orders Reload with Run's start and drain:
	// a reload starts dial loops only while running.
	smap     atomic.Pointer[sitemap.Map]
	reloadMu sync.Mutex
	running  bool

	// degraded: features this gateway runs without, and why (degraded.go).
	degradedMu sync.Mutex
	degraded   []string

	// Limits (Config.Max*): what is in use, and the refusal log.
	lanConns, lanPending, wanPending atomic.Int64
	lanControl                       atomic.Int64 // control connections open
	sources                          sourceTable
	admit                            wanAdmit     // WAN pending slots by source (admit.go)
	pending                          pendingTable // connections before their first frame
	controlBy                        sourceTable  // control connections per host
	refusals                         ratelog.Limiter

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	lanWG   sync.WaitGroup
	stopped chan struct{}
}

// New validates cfg and opens the LAN and WAN listeners (so a test can
// read the bound addresses before Run).
func New(cfg Config) (*Gateway, error) {
	if cfg.Map == nil {
		return nil, errors.New("gateway: no site map")
	}
	site, ok := cfg.Map.Site(cfg.Site)
	if !ok {
		return nil, fmt.Errorf("gateway: site %q is not in the site map", cfg.Site)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.Chunk == 0 {
		cfg.Chunk = 128 << 10
	}
	if cfg.Window == 0 {
		// One stream must be able to fill the WAN: 4 MiB covers 1 Gbit/s at
		// 30 ms RTT. Memory is only used while a destination reads slower
		// than the WAN delivers (bound: streams x window).
		cfg.Window = 4 << 20
	}
	if cfg.WANConns == 0 {
		cfg.WANConns = 1
	}
	if cfg.WANPace > 0 {
		cfg.WAN.MaxPacingRate = cfg.WANPace / 8 / uint64(cfg.WANConns)
	}
	if cfg.WAN.NotSentLowat == 0 {
		cfg.WAN.NotSentLowat = 128 << 10
	}
	var without []string // degraded reasons
	if err := cfg.WAN.CheckTimers(); errors.Is(err, unix.ENOPROTOOPT) {
		without = append(without, degraded.RTOFloor)
		cfg.Logger.Warn("this kernel has no TCP_RTO_MIN_US / TCP_DELACK_MAX_US (Linux 6.15 or newer has them): WAN sockets keep the 200 ms RTO floor, and a lone lost message waits about 200 ms more",
			"wan_rto_min", cfg.WAN.RTOMin, "wan_delack_max", cfg.WAN.DelackMax)
		cfg.WAN.RTOMin, cfg.WAN.DelackMax = 0, 0
	} else if errors.Is(err, unix.EINVAL) {
		return nil, fmt.Errorf("gateway: --wan-rto-min %v / --wan-delack-max %v: %w (the kernel takes more than one clock tick, 4 ms at HZ=250, and at most 200 ms)",
			cfg.WAN.RTOMin, cfg.WAN.DelackMax, err)
	} else if err != nil {
		return nil, fmt.Errorf("gateway: WAN timers: %w", err)
	}
	// The defaults below need a CC this process may set (CheckCC); when the
	// kernel offers it but tcp_allowed_congestion_control keeps it from a
	// process without CAP_NET_ADMIN, the gateway says so and falls back.
	if cfg.WAN.CC == "" {
		// BBR keeps the bottleneck queue short (small messages behind bulk
		// wait less) and, unlike CUBIC, kept the aggregated link near line
		// rate in the lab with TCP_NOTSENT_LOWAT (200 Mbit/s, 20 ms:
		// 97-101 % of direct vs 63 % with CUBIC on shared cores).
		if err := tuning.CheckCC("bbr"); err == nil {
			cfg.WAN.CC = "bbr"
		} else if errors.Is(err, unix.EPERM) {
			cfg.Logger.Warn("WAN sockets keep the system's default congestion control instead of BBR", "err", err)
			without = append(without, degraded.NoBBR)
		}
	}
	if cfg.ExpressCC == "" && cfg.WAN.CC != "" {
		// A BBR socket carrying one message per round trip paces it at the
		// rate of such app-limited samples: in the lab a 16 KiB ping-pong
		// took 17.0 ms per half round trip over BBR vs 10.6 ms direct and
		// over a CUBIC express link (bench/figures/express). Primed,
		// BBR sends messages at the path's rate and holds its window against
		// a competing BBR flow; but the primed estimate ages out of BBR's
		// 10-round filter, and under random loss the first sample that is
		// not app-limited, a message's retransmission, replaces it: 196 ->
		// 2.6 Mbit/s after one loss at 0.1 %, then ~23 (64 KiB ping-pong 62
		// ms where CUBIC with renewal takes 26; bench/figures/bbrexpress).
		if err := tuning.CheckCC("cubic"); err == nil {
			cfg.ExpressCC = "cubic"
		} else if errors.Is(err, unix.EPERM) {
			cfg.Logger.Warn("the express link runs "+cfg.WAN.CC+" instead of CUBIC", "err", err)
			without = append(without, degraded.NoCubic)
		}
	}
	for _, cc := range []string{cfg.LAN.CC, cfg.WAN.CC, cfg.ExpressCC} {
		if err := tuning.CheckCC(cc); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.OpenTimeout == 0 {
		cfg.OpenTimeout = 2 * time.Second
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = time.Second
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.RetireTimeout == 0 {
		cfg.RetireTimeout = defaultRetireTimeout
	}
	if cfg.FirstFrame == 0 {
		cfg.FirstFrame = 10 * time.Second
	}
	if cfg.DeadAfter == 0 {
		// Long enough that a WAN hiccup (or a starved emulator) does not kill
		// every stream of a long MPI job; a connection that is reset fails
		// its streams at once regardless.
		cfg.DeadAfter = 10 * cfg.PingInterval
	}
	cfg.WAN.ThinLinear = true
	if cfg.WAN.UserTimeout == 0 {
		// A link whose data stays unacknowledged this long is dead even if
		// keepalives are stuck behind it.
		cfg.WAN.UserTimeout = cfg.DeadAfter
	}
	if cfg.ExpressMax == 0 {
		// Open MPI's TCP eager fragments are 64 KiB plus the BTL's header:
		// a latency-bound message of up to 64 KiB is one small burst.
		cfg.ExpressMax = min(68<<10, cfg.Chunk)
	}
	gw, err := whichGateway(cfg.Map, site, cfg.ListenLAN, cfg.ListenWAN, nil)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	npeers := 0
	for _, s := range cfg.Map.Sites() {
		if s.ID != site.ID {
			npeers += len(s.Gateways)
		}
	}
	cfg.fillLimits(npeers)
	log := cfg.Logger.With("site", site.Name)
	if len(site.Gateways) > 1 {
		log = log.With("gateway", gw)
	}
	g := &Gateway{cfg: cfg, site: site, gw: gw, me: site.Gateways[gw], log: log,
		peers: map[peerID]*peer{}, readyc: make(chan struct{}), stopped: make(chan struct{})}
	g.guard = tuning.NewProbeGuard()
	g.degraded = without
	g.sources.m = map[netip.Addr]int{}
	g.admit.own, g.admit.other = map[netip.Addr]int{}, map[netip.Addr]int{}
	g.rcfg = relay.Config{Chunk: cfg.Chunk, Window: cfg.Window, ExpressMax: cfg.ExpressMax, NoStripe: !cfg.Stripe,
		PingInterval: cfg.PingInterval, DeadAfter: cfg.DeadAfter, Logger: g.log,
		NoPoller: !cfg.PollThread, RuntimeWakes: !cfg.QuietRuntime, QueueControl: tuning.QueueControl(cfg.WANQueue),
		MaxControl: cfg.MaxControl, MaxEarly: cfg.MaxEarly,
		ReplayMax: int64(cfg.ReplayMax), ResumeWithin: cfg.ResumeWithin,
		Limited: func(reason, peer string, err error) {
			g.refused(reason, "WAN peer hit a limit", "peer", peer, "err", err)
		}}
	g.lan = cfg.Transport
	if g.lan == nil && cfg.LANTransport == "mx" {
		t, err := newMXLAN(&cfg, site)
		if err != nil {
			return nil, fmt.Errorf("gateway: --lan-transport mx: %w", err)
		}
		g.lan = t
	}
	if g.lan == nil {
		g.lan = &TCPTransport{Opts: cfg.LAN}
	}
	if t, ok := g.lan.(*MXTransport); ok {
		if t.Forward == "" {
			t.Forward = cfg.LANForward
		}
		t.refused = g.refused
	}
	g.smap.Store(cfg.Map)
	for _, s := range cfg.Map.Sites() {
		if s.ID != site.ID {
			for i := range s.Gateways {
				g.peers[peerID{s.ID, i}] = g.newPeer(s, i)
			}
		}
	}
	if err := g.initAuth(); err != nil {
		return nil, err
	}
	g.records.m = map[recordKey]record{}
	g.listens.m = map[netip.AddrPort]int{}
	g.records.locals = map[netip.AddrPort]int{}
	g.m = newMetrics(g)
	g.m.sited.MustRegister(degradedCollector{g})
	if g.lanLn, err = g.lan.Listen(g.me.LAN); err != nil {
		return nil, fmt.Errorf("gateway: LAN listener %v: %w", g.me.LAN, err)
	}
	lc := net.ListenConfig{Control: g.wanCreate().Control(nil)}
	wl, err := lc.Listen(context.Background(), "tcp", g.me.WAN.String())
	if err != nil {
		g.lanLn.Close()
		return nil, fmt.Errorf("gateway: WAN listener %v: %w", g.me.WAN, err)
	}
	g.wanLn = wl.(*net.TCPListener)
	if len(g.peers) == 0 {
		g.setReady()
	}
	return g, nil
}

// closeListeners closes the LAN and WAN listeners New opened.
func (g *Gateway) closeListeners() {
	g.lanLn.Close()
	g.wanLn.Close()
}

// Ready is closed once every WAN link has been up at the same time.
func (g *Gateway) Ready() <-chan struct{} { return g.readyc }

// Run serves until ctx ends, then drains: the LAN listener closes, streams
// get DrainTimeout to finish, the rest are reset (code 6) and links close.
func (g *Gateway) Run(ctx context.Context) error {
	g.ctx, g.cancel = context.WithCancel(context.Background())
	defer close(g.stopped)
	// A Run that fails before it serves closes the listeners New opened.
	stopProfile, err := g.startProfile()
	if err != nil {
		g.closeListeners()
		return err
	}
	defer stopProfile()
	var srv *http.Server
	if g.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", metricsListen(g.cfg.MetricsAddr))
		if err != nil {
			g.closeListeners()
			return fmt.Errorf("gateway: metrics listener: %w", err)
		}
		srv = metricsServer(g.m.handler())
		go srv.Serve(newLimitListener(ln, maxMetricsConns))
	}
	keepWarmState := "not checked (--wan-keep-warm=false)"
	if g.cfg.KeepWarm && !tuning.RestartsAfterIdle(g.cfg.WAN.CC, g.cfg.ExpressCC, g.cfg.Express) {
		keepWarmState = "not needed: every WAN socket runs BBR, which Linux never restarts after idle"
	} else if g.cfg.KeepWarm {
		warm, state, err := tuning.WarmState()
		switch {
		case err != nil:
			g.log.Warn("cannot tell whether the WAN links stay warm", "err", err)
			g.degrade(degraded.WarmUnknown)
			keepWarmState = "unknown"
		case !warm:
			g.log.Warn("the CUBIC express link will restart from 10 segments after every pause longer than its RTO: net.ipv4.tcp_slow_start_after_idle is not 0 on this host, and the gateway changes no host setting",
				"fix", tuning.KeepWarmFix)
			g.degrade(degraded.NotWarm)
			keepWarmState = state
		default:
			keepWarmState = state
		}
	}
	g.log.Info("gateway up", "id", g.site.ID, "lan", g.lanLn.Addr().String(), "wan", g.wanLn.Addr().String(),
		"peers", len(g.peerList()), "wan_conns", g.cfg.WANConns, "express", g.cfg.Express, "chunk", g.cfg.Chunk, "window", g.cfg.Window,
		"wan_pace_bps", g.cfg.WANPace, "wan_queue", g.cfg.WANQueue.String(), "probe_rtt_guard", g.cfg.ProbeRTTGuard,
		"express_cc", g.cfg.ExpressCC, "prime", g.cfg.Prime, "keep_warm", keepWarmState,
		"wan_auth", g.auth != nil, "wan_encrypt", g.auth != nil && !g.cfg.WANIntegrityOnly, "wan_allow_ports", g.cfg.AllowPorts.String(), "lan_listen_ports", g.listenPorts().String(),
		"max_lan_conns", g.cfg.MaxLANConns, "max_source_streams", g.cfg.MaxSourceStreams, "max_peer_streams", g.cfg.MaxPeerStreams)
	g.wg.Add(3)
	go g.serveLAN()
	go g.serveWAN()
	go g.sampleWAN()
	if g.cfg.ProbeRTTGuard {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.guard.Run(g.ctx, g.allLinks)
		}()
	}
	g.reloadMu.Lock()
	for _, p := range g.peerList() {
		g.startPeer(p)
	}
	g.running = true
	g.reloadMu.Unlock()
	<-ctx.Done()
	g.log.Info("draining", "timeout", g.cfg.DrainTimeout.String())
	g.reloadMu.Lock()
	g.draining.Store(true)
	g.reloadMu.Unlock()
	g.closeListeners()
	dctx, dcancel := context.WithTimeout(context.Background(), g.cfg.DrainTimeout)
	defer dcancel()
	var dw sync.WaitGroup
	for _, l := range g.allLinks() {
		dw.Add(1)
		go func() { defer dw.Done(); l.Drain(dctx) }()
	}
	dw.Wait()
	g.cancel()
	for _, l := range g.allLinks() {
		l.Close()
	}
	g.wg.Wait()
	if srv != nil {
		srv.Close()
	}
	g.log.Info("gateway stopped")
	return nil
}

// LANAddr and WANAddr are the bound listener addresses.
func (g *Gateway) LANAddr() netip.AddrPort { return g.lanLn.Addr() }

// WANAddr is the bound WAN listener address.
func (g *Gateway) WANAddr() netip.AddrPort {
	return unmapAP(g.wanLn.Addr().(*net.TCPAddr).AddrPort())
}

// ---- WAN mesh ----
