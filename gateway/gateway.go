// Package gateway is the mpi5k site gateway: it accepts the site's nodes on
// the LAN (shims open relayed connections with one OPEN frame, or ask who
// stands behind a relayed connection with PEER_QUERY), keeps a full mesh of
// WAN links (package relay) to every other site's gateway, and applies the
// policy that makes it never an open relay. cmd/mpi5k-gateway is a thin main
// around Gateway.
//
// Where each concern lives:
//   - gateway.go: the Gateway, New, Run (start, drain, stop).
//   - config.go: Config, its settings grouped by concern in the structs
//     it embeds (LANConfig, WANConfig, TuningConfig, ServiceConfig;
//     LimitsConfig in limits.go), DefaultConfig (what the measurements
//     settled) and Validate; flags.go declares the same settings once as
//     command-line flags for mpi5k-gateway and `mpi5k run`.
//   - peers.go: the peer table: a peer is one gateway host of another
//     site (every gateway pair keeps its own links), with its links by
//     index; readiness; the link a new stream takes (pickLink).
//   - wan.go: the WAN mesh's dialing side: the site with the lower id (or
//     the one behind NAT) dials each link, redials after a failure and
//     resumes a broken one; the HELLO both sides send. wan_accept.go: the
//     accepting side, which admits only the site map's gateways.
//   - wan_tune.go: where package tuning's policies meet a WAN link:
//     socket options, priming, the express link's renewals and holds.
//   - identity.go: which of its site's gateway hosts this gateway is.
//   - serve.go: the LAN side: OPEN and PEER_QUERY from the site's nodes, the
//     destination policy (destinations must be in this site and not a
//     gateway), streams opened from the WAN, the record of relayed peers.
//   - limits.go: the caps on streams, connections and pending handshakes
//     (LimitsConfig, docs/limits.md); admit.go: which pending WAN connections are taken
//     before they authenticate (per-source pools, random early drop).
//   - lan.go: the LAN transport interface.
//   - tcpevents.go, metrics.go: TCP_INFO sampling of the WAN links and the
//     /metrics and /ready endpoints.
//   - reload.go: a new site map in force while streams run (service mode);
//     degraded.go: what the gateway runs without (the reasons and their
//     sentences are package gateway/degraded, which mpi5k run's summary
//     reads too).
//
// The multiplexing itself (streams, trunks, the poller thread, the hooks
// of queue and express control) is package relay; the WAN tuning policies
// the gateway applies to its sockets and links (socket options,
// congestion control, priming, the PROBE_RTT guard, keeping links warm,
// queue control, the express link's renewal and yield) are package tuning.
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

	"github.com/mpi5k/mpi5k/gateway/degraded"
	"github.com/mpi5k/mpi5k/internal/ratelog"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tuning"
)

// Gateway is one site's gateway.
type Gateway struct {
	cfg  Config
	site *sitemap.Site
	log  *slog.Logger
	// mine is the layout of the gateway's preset, alt under --wan-trunk
	// auto the other preset's (nil otherwise): each peer runs one of them
	// (trunk.go).
	mine, alt *layout
	lan       LANTransport
	peers     map[peerID]*peer // by site id and gateway index
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
	if cfg.Trunk == TrunkAuto {
		return nil, errors.New("gateway: --wan-trunk auto is resolved on the gateway's host: start from the Config that Flags.Config returns there")
	}
	cfg.fillDefaults()
	without, err := cfg.checkKernel()
	if err != nil {
		return nil, err
	}
	gw, err := whichGateway(cfg.Map, site, cfg.ListenLAN, cfg.ListenWAN, nil)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	cfg.fillLimits(peerCount(cfg.Map, site))
	g := newGateway(cfg, site, gw)
	// The links take their settings as they are (relay.Config): a value
	// out of their range fails here, not at the first link.
	for _, l := range g.layouts() {
		if err := l.rcfg.Validate(); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	g.degraded = without
	if err := g.initLAN(); err != nil {
		return nil, err
	}
	g.initPeers()
	if err := g.initAuth(); err != nil {
		return nil, err
	}
	g.m = newMetrics(g)
	g.m.sited.MustRegister(degradedCollector{g})
	if err := g.listen(); err != nil {
		return nil, err
	}
	if len(g.peers) == 0 {
		g.setReady()
	}
	return g, nil
}

// newGateway makes gateway gw of site with the settings cfg, which New
// has completed: its tables, and the configuration of its WAN links.
func newGateway(cfg Config, site *sitemap.Site, gw int) *Gateway {
	log := cfg.Logger.With("site", site.Name)
	if len(site.Gateways) > 1 {
		log = log.With("gateway", gw)
	}
	g := &Gateway{cfg: cfg, site: site, gw: gw, me: site.Gateways[gw], log: log,
		peers: map[peerID]*peer{}, readyc: make(chan struct{}), stopped: make(chan struct{})}
	g.guard = tuning.NewProbeGuard()
	g.sources.m = map[netip.Addr]int{}
	g.admit.own, g.admit.other = map[netip.Addr]int{}, map[netip.Addr]int{}
	limited := func(reason, peer string, err error) {
		g.refused(reason, "WAN peer hit a limit", "peer", peer, "err", err)
	}
	g.mine = newLayout(&cfg, cfg.relayConfig(g.log, limited))
	if a := cfg.TrunkAlt; a != nil {
		alt := cfg
		alt.WANConns, alt.TuningConfig = a.WANConns, a.TuningConfig
		alt.TrunkAlt = nil
		alt.fillDefaults()
		g.alt = newLayout(&alt, alt.relayConfig(g.log, limited))
	}
	g.records.m = map[recordKey]record{}
	g.listens.m = map[netip.AddrPort]int{}
	g.records.locals = map[netip.AddrPort]int{}
	return g
}

// listen opens the LAN and WAN listeners.
func (g *Gateway) listen() error {
	var err error
	if g.lanLn, err = g.lan.Listen(g.me.LAN); err != nil {
		return fmt.Errorf("gateway: LAN listener %v: %w", g.me.LAN, err)
	}
	lc := net.ListenConfig{Control: g.wanCreate().Control(nil)}
	wl, err := lc.Listen(context.Background(), "tcp", g.me.WAN.String())
	if err != nil {
		g.lanLn.Close()
		return fmt.Errorf("gateway: WAN listener %v: %w", g.me.WAN, err)
	}
	g.wanLn = wl.(*net.TCPListener)
	return nil
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
	express := g.anyLayout(func(l *layout) bool { return l.express })
	if g.cfg.KeepWarm && !tuning.RestartsAfterIdle(g.cfg.WAN.CC, g.cfg.ExpressCC, express) {
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
		"peers", len(g.peerList()), "trunk", g.cfg.Trunk, "trunk_by_host_cc", g.cfg.TrunkCC, "trunk_agreed_per_pair", g.alt != nil, "wan_conns", g.cfg.WANConns, "express", g.cfg.Express, "chunk", g.cfg.Chunk, "window", g.cfg.Window,
		"wan_pace_bps", g.cfg.WANPace, "wan_queue", g.cfg.WANQueue.String(), "probe_rtt_guard", g.cfg.ProbeRTTGuard,
		"express_cc", g.cfg.ExpressCC, "prime", g.cfg.Prime, "keep_warm", keepWarmState,
		"wan_auth", g.auth != nil, "wan_encrypt", g.auth != nil && !g.cfg.WANIntegrityOnly, "wan_allow_ports", g.cfg.AllowPorts.String(), "lan_listen_ports", g.listenPorts().String(),
		"max_lan_conns", g.cfg.MaxLANConns, "max_source_streams", g.cfg.MaxSourceStreams, "max_peer_streams", g.cfg.MaxPeerStreams)
	g.wg.Add(3)
	go g.serveLAN()
	go g.serveWAN()
	go g.sampleWAN()
	if g.anyLayout(func(l *layout) bool { return l.guard }) {
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
