// Package gateway is the mpi5k site gateway: it accepts the site's nodes on
// the LAN (shims open relayed connections with one OPEN frame, or ask who
// stands behind a relayed connection with PEER_QUERY), keeps a full mesh of
// WAN links (package relay) to every other site's gateway, and applies the
// policy that makes it never an open relay. cmd/mpi5k-gateway is a thin main
// around Gateway.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Config configures a gateway. Zero fields take defaults.
type Config struct {
	Map  *sitemap.Map
	Site string // this gateway's site

	LAN SockOpts // options of LAN sockets
	WAN SockOpts // options of WAN sockets (NotSentLowat defaults to 128 KiB, CC to bbr when available)

	Chunk    int    // DATA chunk (default 128 KiB)
	Window   uint32 // per-stream receive window (default 4 MiB)
	WANConns int    // parallel bulk links per site pair (default 1); large writes are striped over them
	// NoExpress drops the express link: by default every site pair has one
	// more WAN connection that carries only messages (bursts of up to
	// ExpressMax bytes), so a small message never waits behind bulk bytes
	// queued in a bulk link's socket (see package relay, figure (d)).
	NoExpress bool
	// ExpressCC is the congestion control of the express link ("" = CUBIC
	// when --wan-cc is set, else the WAN sockets' CC).
	ExpressCC string
	// ExpressMax is the largest burst counted as a message (0 = 68 KiB, or
	// the chunk if smaller): it takes the express link.
	ExpressMax int
	// WANPace caps each site pair's bulk WAN sending rate (bit/s, shared
	// evenly by its WANConns bulk links, which one stream's chunks are
	// striped over; the express link is not capped; 0 = no cap). Set a few
	// percent below the WAN bottleneck, it keeps the bottleneck queue
	// empty: the bulk of one stream then adds no queueing delay and no
	// drop-tail losses to the small messages of the others. It is meant for
	// a WAN the site pair has to itself: against competing flows a capped
	// link only loses its share.
	WANPace uint64
	// WANQueue turns on queue control on the bulk links (0 = off; the
	// mpi5k-gateway command defaults to 1 ms): a link that saturates the
	// WAN keeps about this much queue at the bottleneck, by capping the
	// peer's receive window at the measured rate x (min RTT + WANQueue),
	// and lifts the cap while another flow keeps the queue full (see
	// package relay, queue control).
	WANQueue time.Duration
	// NoRenew keeps each express link for its whole life. By default a
	// gateway replaces an express link whose congestion window losses have
	// cut below one message (ExpressMax) with a fresh connection: the link
	// carries app-limited messages, which never regrow a window that loss
	// recovery has cut (see package relay, renewal).
	NoRenew bool
	// NoProbeRTTGuard lets busy BBR bulk links dip into PROBE_RTT (cwnd 4
	// for 200 ms every 10 s of bulk). By default the PROBE_RTT guard (see
	// probertt.go) idles such a link across its min_rtt filter's expiry,
	// which BBR then takes as a restart from idle instead.
	NoProbeRTTGuard bool
	// NoPrime leaves a new BBR WAN link to learn the path from what it
	// carries. By default the gateway fills it with PAD frames until BBR
	// leaves STARTUP, since BBR paces app-limited messages at the rate of
	// earlier ones and grows a low estimate by only 25 % per eight round
	// trips (see prime.go). CUBIC and Reno links are never primed.
	NoPrime bool
	// KeepWarm checks net.ipv4.tcp_slow_start_after_idle in the gateway's
	// network namespace (the mpi5k-gateway command defaults to on) if any
	// WAN socket runs a CC other than BBR, and warns with the fix when it is
	// not 0: a CUBIC express link then restarts from 10 segments after every
	// pause longer than its RTO (see warm.go). The gateway never writes it;
	// the service unit does, and restores it on every stop.
	KeepWarm bool
	// NoPollThread waits for idle sockets in Go's network poller instead of
	// the relay's poller thread, which forwards small messages with one
	// thread wake-up per gateway (see package relay, figure (a)).
	NoPollThread bool
	// NoQuietRuntime leaves Go's runtime watching the input of sockets the
	// poller thread owns (package relay, rtquiet.go): each arriving byte
	// then wakes a runtime thread too.
	NoQuietRuntime bool

	ReadyFile   string // written once every WAN link is up and primed (prime.go)
	MetricsAddr string // HTTP listener for /metrics and /ready ("" = none)

	DialTimeout  time.Duration // LAN connect to a destination (default 10 s)
	OpenTimeout  time.Duration // how long an OPEN waits for a WAN link (default 2 s)
	PingInterval time.Duration // WAN keepalive (default 1 s)
	DeadAfter    time.Duration // a link silent this long is dead; also TCP_USER_TIMEOUT (default 10 × PingInterval)
	DrainTimeout time.Duration // SIGTERM: how long streams may finish (default 10 s)
	FirstFrame   time.Duration // how long a LAN connection may take to send OPEN/PEER_QUERY (default 10 s)

	Transport LANTransport // nil = kernel TCP with the LAN options
	Logger    *slog.Logger
}

// Gateway is one site's gateway.
type Gateway struct {
	cfg   Config
	site  *sitemap.Site
	log   *slog.Logger
	rcfg  relay.Config
	lan   LANTransport
	peers map[uint8]*peer // by site id

	lanLn LANListener
	wanLn *net.TCPListener

	peersMu sync.Mutex // guards peer.links and readiness
	ready   bool
	readyc  chan struct{}
	priming int // links being primed (prime.go); readiness waits for them

	records  peerTable
	m        *metrics
	guard    probeGuard
	draining atomic.Bool // SIGTERM: refuse new streams from peers

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	lanWG   sync.WaitGroup
	stopped chan struct{}
}

// peer is another site and our links to it.
type peer struct {
	site   *sitemap.Site
	dialer bool          // we dial (our id is lower)
	trunk  *relay.Trunk  // the links' shared streams
	links  []*relay.Link // by link index (bulk links, then the express link); nil while down
	// renew wakes the dialer's express dialLoop to replace a working
	// express link; renewed counts renewals (both sides).
	renew   chan struct{}
	renewed atomic.Uint64
	// primeMu: one link of the pair primes at a time, so each measures
	// the path's rate rather than a share of it (prime.go).
	primeMu sync.Mutex
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
	if cfg.Chunk == 0 {
		cfg.Chunk = 128 << 10
	}
	if cfg.Chunk < 1 || cfg.Chunk > header.MaxPayload {
		return nil, fmt.Errorf("gateway: chunk %d out of range 1..%d", cfg.Chunk, header.MaxPayload)
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
	if cfg.WANConns < 1 || cfg.WANConns > 63 {
		return nil, fmt.Errorf("gateway: --wan-conns %d out of range 1..63", cfg.WANConns)
	}
	if cfg.WANQueue < 0 {
		return nil, fmt.Errorf("gateway: --wan-queue %v is negative (0 turns queue control off)", cfg.WANQueue)
	}
	if cfg.WANPace > 0 {
		if cfg.WANPace < 8000*uint64(cfg.WANConns) {
			return nil, fmt.Errorf("gateway: --wan-pace %d bit/s is below 8 kbit/s per WAN connection", cfg.WANPace)
		}
		cfg.WAN.MaxPacingRate = cfg.WANPace / 8 / uint64(cfg.WANConns)
	}
	if cfg.WAN.NotSentLowat == 0 {
		cfg.WAN.NotSentLowat = 128 << 10
	}
	if cfg.WAN.RTOMin < 0 || cfg.WAN.DelackMax < 0 {
		return nil, fmt.Errorf("gateway: --wan-rto-min %v / --wan-delack-max %v: negative (0 keeps the kernel's)", cfg.WAN.RTOMin, cfg.WAN.DelackMax)
	}
	if err := cfg.WAN.checkTimers(); errors.Is(err, unix.ENOPROTOOPT) {
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
		if err := CheckCC("bbr"); err == nil {
			cfg.WAN.CC = "bbr"
		} else if errors.Is(err, unix.EPERM) {
			cfg.Logger.Warn("WAN sockets keep the system's default congestion control instead of BBR", "err", err)
		}
	}
	if cfg.ExpressCC == "" && cfg.WAN.CC != "" {
		// A BBR socket carrying one message per round trip paces it at the
		// rate of such app-limited samples: in the lab a 16 KiB ping-pong
		// took 17.0 ms per half round trip over BBR vs 10.6 ms direct and
		// over a CUBIC express link (see package relay, figure (e)). Primed,
		// BBR sends messages at the path's rate and holds its window against
		// a competing BBR flow; but the primed estimate ages out of BBR's
		// 10-round filter, and under random loss the first sample that is
		// not app-limited, a message's retransmission, replaces it: 196 ->
		// 2.6 Mbit/s after one loss at 0.1 %, then ~23 (64 KiB ping-pong 62
		// ms where CUBIC with renewal takes 26; bench/figures/bbrexpress).
		if err := CheckCC("cubic"); err == nil {
			cfg.ExpressCC = "cubic"
		} else if errors.Is(err, unix.EPERM) {
			cfg.Logger.Warn("the express link runs "+cfg.WAN.CC+" instead of CUBIC", "err", err)
		}
	}
	for _, cc := range []string{cfg.LAN.CC, cfg.WAN.CC, cfg.ExpressCC} {
		if err := CheckCC(cc); err != nil {
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
	if cfg.ExpressMax < 0 || cfg.ExpressMax > cfg.Chunk {
		return nil, fmt.Errorf("gateway: --express-max %d out of range 0..chunk (%d)", cfg.ExpressMax, cfg.Chunk)
	}
	g := &Gateway{cfg: cfg, site: site, log: cfg.Logger.With("site", site.Name),
		peers: map[uint8]*peer{}, readyc: make(chan struct{}), stopped: make(chan struct{})}
	g.guard.kick = make(chan struct{}, 1)
	g.rcfg = relay.Config{Chunk: cfg.Chunk, Window: cfg.Window, ExpressMax: cfg.ExpressMax,
		PingInterval: cfg.PingInterval, DeadAfter: cfg.DeadAfter, Logger: g.log,
		NoPoller: cfg.NoPollThread, RuntimeWakes: cfg.NoQuietRuntime, QueueTarget: cfg.WANQueue}
	g.lan = cfg.Transport
	if g.lan == nil {
		g.lan = &TCPTransport{Opts: cfg.LAN}
	}
	for _, s := range cfg.Map.Sites() {
		if s.ID != site.ID {
			p := &peer{site: s, dialer: site.ID < s.ID, links: make([]*relay.Link, g.numLinks()), renew: make(chan struct{}, 1)}
			p.trunk = relay.NewTrunk(p.dialer, relay.HandlerFunc(g.openFromWAN))
			p.trunk.OnRenew(func() { kickRenew(p) })
			g.peers[s.ID] = p
		}
	}
	g.records.m = map[recordKey]record{}
	g.m = newMetrics(g)
	var err error
	if g.lanLn, err = g.lan.Listen(site.LAN); err != nil {
		return nil, fmt.Errorf("gateway: LAN listener %v: %w", site.LAN, err)
	}
	lc := net.ListenConfig{Control: g.wanCreate().control(nil)}
	wl, err := lc.Listen(context.Background(), "tcp", site.WAN.String())
	if err != nil {
		g.lanLn.Close()
		return nil, fmt.Errorf("gateway: WAN listener %v: %w", site.WAN, err)
	}
	g.wanLn = wl.(*net.TCPListener)
	if len(g.peers) == 0 {
		g.setReady()
	}
	return g, nil
}

// Ready is closed once every WAN link has been up at the same time.
func (g *Gateway) Ready() <-chan struct{} { return g.readyc }

// Run serves until ctx ends, then drains: the LAN listener closes, streams
// get DrainTimeout to finish, the rest are reset (code 6) and links close.
func (g *Gateway) Run(ctx context.Context) error {
	g.ctx, g.cancel = context.WithCancel(context.Background())
	defer close(g.stopped)
	var srv *http.Server
	if g.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", g.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("gateway: metrics listener: %w", err)
		}
		srv = &http.Server{Handler: g.m.handler(), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
	}
	keepWarmState := "not checked (--wan-keep-warm=false)"
	if g.cfg.KeepWarm && !g.cfg.restartsAfterIdle() {
		keepWarmState = "not needed: every WAN socket runs BBR, which Linux never restarts after idle"
	} else if g.cfg.KeepWarm {
		warm, state, err := warmState()
		switch {
		case err != nil:
			g.log.Warn("cannot tell whether the WAN links stay warm", "err", err)
			keepWarmState = "unknown"
		case !warm:
			g.log.Warn("the CUBIC express link will restart from 10 segments after every pause longer than its RTO: net.ipv4.tcp_slow_start_after_idle is not 0 on this host, and the gateway changes no host setting",
				"fix", KeepWarmFix)
			keepWarmState = state
		default:
			keepWarmState = state
		}
	}
	g.log.Info("gateway up", "id", g.site.ID, "lan", g.lanLn.Addr().String(), "wan", g.wanLn.Addr().String(),
		"peers", len(g.peers), "wan_conns", g.cfg.WANConns, "express", !g.cfg.NoExpress, "chunk", g.cfg.Chunk, "window", g.cfg.Window,
		"wan_pace_bps", g.cfg.WANPace, "wan_queue", g.cfg.WANQueue.String(), "probe_rtt_guard", !g.cfg.NoProbeRTTGuard,
		"express_cc", g.cfg.ExpressCC, "prime", !g.cfg.NoPrime, "keep_warm", keepWarmState)
	g.wg.Add(3)
	go g.serveLAN()
	go g.serveWAN()
	go g.sampleWAN()
	if !g.cfg.NoProbeRTTGuard {
		g.wg.Add(1)
		go g.guardProbeRTT()
	}
	for _, p := range g.peers {
		if p.dialer {
			for i := range p.links {
				g.wg.Add(1)
				go g.dialLoop(p, i)
			}
		}
	}
	<-ctx.Done()
	g.log.Info("draining", "timeout", g.cfg.DrainTimeout.String())
	g.draining.Store(true)
	g.lanLn.Close()
	g.wanLn.Close()
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

func (g *Gateway) allLinks() []*relay.Link {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	var ls []*relay.Link
	for _, p := range g.peers {
		for _, l := range p.links {
			if l != nil {
				ls = append(ls, l)
			}
		}
	}
	return ls
}

// LANAddr and WANAddr are the bound listener addresses.
func (g *Gateway) LANAddr() netip.AddrPort { return g.lanLn.Addr() }

// WANAddr is the bound WAN listener address.
func (g *Gateway) WANAddr() netip.AddrPort {
	return unmapAP(g.wanLn.Addr().(*net.TCPAddr).AddrPort())
}

// ---- WAN mesh ----

// setLink installs l as p's link i. priming: l is about to be primed, and
// the gateway is not ready until primeLink has finished with it.
func (g *Gateway) setLink(p *peer, i int, l *relay.Link, priming bool) {
	g.peersMu.Lock()
	old := p.links[i]
	p.links[i] = l
	if priming {
		g.priming++
	}
	all := g.allUpLocked()
	g.peersMu.Unlock()
	// A renewal is counted by the new link: the retired one may already
	// have closed (and left the slot nil) when both RETIREs crossed
	// before we got here.
	if l.Renews() {
		p.renewed.Add(1)
	}
	switch {
	case old == nil || old == l:
	case old.Retiring(): // renewed: it closes itself once RETIRE has crossed
	default:
		old.Close()
	}
	if all {
		g.setReady()
	}
	l.OnClose(func(err error) {
		g.peersMu.Lock()
		if p.links[i] == l {
			p.links[i] = nil
		}
		g.peersMu.Unlock()
	})
}

func (g *Gateway) setReady() {
	g.peersMu.Lock()
	first := !g.ready
	g.ready = true
	g.peersMu.Unlock()
	if !first {
		return
	}
	if g.cfg.ReadyFile != "" {
		if err := os.WriteFile(g.cfg.ReadyFile, []byte(fmt.Sprintf("ready %s %d\n", g.site.Name, os.Getpid())), 0o644); err != nil {
			g.log.Error("cannot write ready file", "path", g.cfg.ReadyFile, "err", err)
		}
	}
	close(g.readyc) // after the file, so whoever waits on Ready can read it
	g.log.Info("ready: every WAN link is up (and primed)")
}

// allUp reports whether every link is currently up and none is being primed
// (the /ready endpoint).
func (g *Gateway) allUp() bool {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	return g.allUpLocked()
}

// allUpLocked: every link is up and none is being primed.
func (g *Gateway) allUpLocked() bool {
	if g.priming > 0 {
		return false
	}
	for _, p := range g.peers {
		for _, l := range p.links {
			if l == nil {
				return false
			}
		}
	}
	return true
}

// numLinks is the links per site pair: the bulk ones and the express one.
func (g *Gateway) numLinks() int {
	if g.cfg.NoExpress {
		return g.cfg.WANConns
	}
	return g.cfg.WANConns + 1
}

// isExpress tells whether link index i is the express link.
func (g *Gateway) isExpress(i int) bool { return !g.cfg.NoExpress && i == g.cfg.WANConns }

func (g *Gateway) features() uint8 {
	f := header.FeatureTrunk | header.FeatureClamp | header.FeaturePad
	if !g.cfg.NoExpress {
		f |= header.FeatureExpress
		if !g.cfg.NoRenew {
			f |= header.FeatureRenew
		}
	}
	return f
}

func (g *Gateway) hello(i int) header.Hello {
	h := g.rcfg.Hello(g.site.ID, g.site.Name, uint8(i), uint8(g.numLinks()))
	h.Features = g.features()
	return h
}

// wanCreate is the options WAN sockets are created with. With an express
// congestion control they are created with it and the bulk links switch to
// the WAN one after the handshake: a socket once run by BBR keeps the
// kernel's pacing on whatever it switches to (sk_pacing_status), which
// spreads every small burst over most of an RTT, so the express link must
// never have been BBR.
func (g *Gateway) wanCreate() SockOpts {
	o := g.cfg.WAN
	if g.cfg.ExpressCC != "" && o.CC != "" {
		o.CC = g.cfg.ExpressCC
	}
	return o
}

// addLink joins conn to p's trunk as link i. The express link is exempt from
// --wan-pace (it carries only messages, and they must not wait for a
// pacing slot) and may have its own congestion control.
//
// since is a time before the TCP connection was established: the PROBE_RTT
// guard starts its BBR min_rtt clock there.
func (g *Gateway) addLink(p *peer, i int, c *net.TCPConn, ph header.Hello, since time.Time) *relay.Link {
	x := g.isExpress(i)
	var err error
	switch {
	case x && g.cfg.WAN.MaxPacingRate > 0:
		err = tuneLink(c, true, "")
	case !x && g.cfg.ExpressCC != "" && g.cfg.ExpressCC != g.cfg.WAN.CC:
		err = tuneLink(c, false, g.cfg.WAN.CC)
	}
	if err != nil {
		g.log.Warn("WAN link: socket options not set", "peer", p.site.Name, "link", i, "express", x, "err", err)
	}
	l := p.trunk.Add(c, g.rcfg, ph, i, x)
	if !x && !g.cfg.NoProbeRTTGuard {
		g.guard.begin(l, since) // before setLink publishes l to the guard
	}
	g.setLink(p, i, l, !g.cfg.NoPrime)
	if !g.cfg.NoPrime {
		go g.primeLink(p, i, x, l)
	}
	return l
}

// primeLink primes link l (see prime.go), after any other link of p's, and
// logs what it did.
func (g *Gateway) primeLink(p *peer, i int, express bool, l *relay.Link) {
	p.primeMu.Lock()
	r := prime(l, express, primeMaxTime)
	p.primeMu.Unlock()
	g.peersMu.Lock()
	g.priming--
	all := g.allUpLocked()
	g.peersMu.Unlock()
	if all {
		g.setReady()
	}
	log := g.log.With("peer", p.site.Name, "link", i, "express", express)
	switch {
	case r.skipped != "":
		log.Debug("WAN link not primed", "why", r.skipped)
	case r.err != nil:
		log.Debug("WAN link priming ended with the link", "err", r.err, "pad_bytes", r.bytes)
	case r.took >= primeMaxTime:
		log.Warn("WAN link priming gave up after its time limit", "bbr_mode", r.mode.String(), "estimate_settled", r.primed,
			"pad_bytes", r.bytes, "took", r.took.Round(time.Millisecond), "bbr_bw_bps", 8*r.bw)
	default:
		// Not settled: the filler limit, reached first on a path of tiny
		// BDP, where the estimate is far above any message's needs.
		log.Info("WAN link primed", "bbr_mode", r.mode.String(), "estimate_settled", r.primed,
			"pad_bytes", r.bytes, "took", r.took.Round(time.Millisecond), "bbr_bw_bps", 8*r.bw)
	}
}

// dialLoop keeps link i to p up: dial, handshake, run until it dies,
// reconnect with capped exponential backoff plus jitter.
func (g *Gateway) dialLoop(p *peer, i int) {
	defer g.wg.Done()
	backoff := 50 * time.Millisecond
	log := g.log.With("peer", p.site.Name, "link", i)
	for g.ctx.Err() == nil {
		l, err := g.dialOnce(p, i)
		if err != nil {
			// The first failures are normal while peers start up.
			lvl := slog.LevelDebug
			if backoff >= 400*time.Millisecond {
				lvl = slog.LevelWarn
			}
			log.Log(g.ctx, lvl, "WAN dial failed", "addr", p.site.WAN.String(), "err", err, "retry_in", backoff.String())
			g.m.wanDialFailures.Inc()
			select {
			case <-time.After(backoff + rand.N(backoff/2+1)):
			case <-g.ctx.Done():
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		log.Info("WAN link up", "remote", l.Conn().RemoteAddr().String())
		var lastRenew time.Time
		var later <-chan time.Time
		var renew chan struct{} // only the express link's loop renews
		if g.isExpress(i) {
			renew = p.renew
		}
		for l != nil {
			select {
			case <-l.Done():
				if g.draining.Load() {
					return
				}
				log.Warn("WAN link lost; reconnecting", "err", l.Err())
				l = nil
			case <-later:
				later = nil
				kickRenew(p)
			case <-renew:
				// At most one renewal per renewGap, whoever asks; a request
				// that comes sooner waits for the gap to pass.
				if g.draining.Load() || later != nil {
					continue
				}
				if wait := renewGap - time.Since(lastRenew); wait > 0 {
					later = time.After(wait)
					continue
				}
				lastRenew = time.Now()
				// The old link retires once the new one is in its place
				// (relay.Trunk.Add); if the dial fails it simply stays.
				if nl, err := g.dialOnce(p, i); err != nil {
					log.Warn("express link renewal failed; keeping the old link", "err", err)
				} else {
					log.Debug("express link renewed", "remote", nl.Conn().RemoteAddr().String())
					l = nl
				}
			case <-g.ctx.Done():
				return
			}
		}
	}
}

// expressCold: a socket with this cwnd, ssthresh and MSS (TCP_INFO) has
// left slow start below the segments of one message of max bytes, and its
// window is below them too. A socket still in its first slow start
// (ssthresh infinite) is never cold: it grows to twice the largest burst.
func expressCold(cwnd, ssthresh, mss uint32, max int) bool {
	if mss == 0 {
		return false
	}
	need := uint32((max + int(mss) - 1) / int(mss))
	return ssthresh < need && cwnd < need
}

func kickRenew(p *peer) {
	select {
	case p.renew <- struct{}{}:
	default:
	}
}

// renewGap is the shortest time between two renewals of a site pair's
// express link, which bounds the handshakes a lossy WAN can cost.
const renewGap = time.Second

// checkExpress renews the express links whose congestion window is cold:
// loss recovery has set the slow-start threshold below one message of
// ExpressMax bytes and the window is still below it. Messages are
// app-limited, so such a window hardly grows again, and every message
// larger than it costs extra round trips; a fresh connection starts in
// slow start and grows to twice the largest message within a few. Each
// side judges the window it sends with: the dialer dials, the acceptor
// asks it to with RENEW. Called every wanSampleEvery, right after the
// sampler has read every link's TCP_INFO, whose samples it uses.
func (g *Gateway) checkExpress() {
	if g.cfg.NoExpress || g.cfg.NoRenew {
		return
	}
	g.peersMu.Lock()
	type cand struct {
		p *peer
		l *relay.Link
	}
	var cs []cand
	for _, p := range g.peers {
		if l := p.links[g.cfg.WANConns]; l != nil && !l.Retiring() {
			cs = append(cs, cand{p, l})
		}
	}
	g.peersMu.Unlock()
	for _, c := range cs {
		in, ok := g.m.ev.last(c.l)
		if !ok || !expressCold(in.SndCwnd, in.SndSsthresh, in.SndMSS, g.cfg.ExpressMax) {
			continue
		}
		if c.p.dialer {
			kickRenew(c.p)
		} else {
			c.l.RequestRenew(renewGap)
		}
	}
}

func (g *Gateway) dialOnce(p *peer, i int) (*relay.Link, error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: g.wanCreate().control(nil),
		LocalAddr: &net.TCPAddr{IP: g.site.WAN.Addr().AsSlice()}} // the acceptor checks our source address
	since := time.Now()
	c, err := d.DialContext(g.ctx, "tcp", p.site.WAN.String())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	ph, err := relay.Handshake(ctx, c, g.hello(i))
	if err == nil {
		// The acceptor answers before it knows our index: only the
		// dialer's index is meaningful.
		err = g.checkHello(ph, p, -1)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return g.addLink(p, i, c.(*net.TCPConn), ph, since), nil
}

func (g *Gateway) checkHello(h header.Hello, p *peer, i int) error {
	switch {
	case h.SiteID != p.site.ID:
		return fmt.Errorf("peer says it is site id %d, want %d", h.SiteID, p.site.ID)
	case h.Name != p.site.Name:
		return fmt.Errorf("peer says it is site %q, want %q", h.Name, p.site.Name)
	case int(h.LinkCount) != g.numLinks() || h.Features != g.features():
		return fmt.Errorf("peer has %d links per site pair (features %#x), we have %d (features %#x): "+
			"use the same --wan-conns and --wan-express on every gateway", h.LinkCount, h.Features, g.numLinks(), g.features())
	case i >= 0 && int(h.LinkIndex) != i:
		return fmt.Errorf("peer link index %d, want %d", h.LinkIndex, i)
	}
	return nil
}

func (g *Gateway) serveWAN() {
	defer g.wg.Done()
	for {
		c, err := g.wanLn.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.log.Warn("WAN accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go g.acceptWAN(c)
	}
}

// acceptWAN admits a peer gateway: its source address must be the WAN
// address of a site with a higher id than ours, and its HELLO must name
// that site.
// acceptLag bounds how long an established WAN connection waits in the
// accept queue before acceptWAN runs.
const acceptLag = 20 * time.Millisecond

func (g *Gateway) acceptWAN(c *net.TCPConn) {
	// The kernel established the connection just before accept returned
	// (the accept loop never lags by more than a scheduling delay).
	since := time.Now().Add(-acceptLag)
	remote := unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	var cands []*peer
	for _, p := range g.peers {
		if !p.dialer && p.site.WAN.Addr() == remote.Addr() {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		g.log.Warn("WAN connection refused: source is no peer gateway in the site map", "remote", remote.String())
		g.m.wanRefused.Inc()
		c.SetLinger(0)
		c.Close()
		return
	}
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	ph, err := relay.Handshake(ctx, c, g.hello(0))
	var p *peer
	if err == nil {
		for _, q := range cands {
			if q.site.ID == ph.SiteID {
				p = q
			}
		}
		switch {
		case p == nil:
			err = fmt.Errorf("HELLO claims site id %d, which does not have WAN address %v", ph.SiteID, remote.Addr())
		case int(ph.LinkIndex) >= g.numLinks():
			err = fmt.Errorf("link index %d with %d links per site pair", ph.LinkIndex, g.numLinks())
		default:
			err = g.checkHello(ph, p, int(ph.LinkIndex))
		}
	}
	if err != nil {
		g.log.Warn("WAN connection refused", "remote", remote.String(), "err", err)
		g.m.wanRefused.Inc()
		c.SetLinger(0)
		c.Close()
		return
	}
	// Our HELLO went out with index 0 before we knew theirs; only the
	// dialer's index matters (the acceptor's fields are informational).
	g.addLink(p, int(ph.LinkIndex), c, ph, since)
	g.log.Info("WAN link up", "peer", p.site.Name, "link", ph.LinkIndex, "remote", remote.String())
}

// pickLink returns the up bulk link to site with the fewest streams
// homed on it, waiting up to OpenTimeout for one to come up. The express
// link homes no stream: it must stay free for small frames.
func (g *Gateway) pickLink(p *peer) *relay.Link {
	deadline := time.Now().Add(g.cfg.OpenTimeout)
	for {
		var best *relay.Link
		bestN := 0
		g.peersMu.Lock()
		for i, l := range p.links {
			if l == nil || g.isExpress(i) {
				continue
			}
			if n := l.NumStreams(); best == nil || n < bestN {
				best, bestN = l, n
			}
		}
		g.peersMu.Unlock()
		if best != nil || time.Now().After(deadline) {
			return best
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-g.ctx.Done():
			return nil
		}
	}
}

// ---- LAN side ----

func (g *Gateway) serveLAN() {
	defer g.wg.Done()
	for {
		c, err := g.lanLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.log.Warn("LAN accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go g.handleLAN(c)
	}
}

func (g *Gateway) refuseLAN(c LANConn, reason string, args ...any) {
	g.log.Warn("LAN connection refused: "+reason, append([]any{"remote", c.Remote().String()}, args...)...)
	g.m.lanRefused.Inc()
	c.Abort()
}

// handleLAN reads the first frame of a node's connection: OPEN (then raw
// bytes both ways) or PEER_QUERY (a control connection).
func (g *Gateway) handleLAN(c LANConn) {
	if s, ok := g.cfg.Map.Lookup(c.Remote().Addr()); !ok || s.ID != g.site.ID {
		g.refuseLAN(c, "source is not a node of this site")
		return
	}
	dl, _ := c.(interface{ SetReadDeadline(time.Time) error })
	if dl != nil {
		dl.SetReadDeadline(time.Now().Add(g.cfg.FirstFrame))
	}
	// Read the first frame exactly (no read-ahead): after OPEN come the
	// application's own bytes, which belong to the stream.
	h, body, err := header.ReadOne(c, header.MaxPayload)
	if err != nil {
		// err says which: none (EOF, timeout), undecodable, or truncated.
		g.refuseLAN(c, "no valid first frame", "err", err)
		return
	}
	if dl != nil {
		dl.SetReadDeadline(time.Time{})
	}
	switch h.Type {
	case header.TypeOpen:
		g.openFromLAN(c, h, body)
	case header.TypePeerQuery:
		g.serveQueries(c, h, body)
	default:
		g.refuseLAN(c, "first frame must be OPEN or PEER_QUERY", "type", h.Type.String())
	}
}

func (g *Gateway) openFromLAN(c LANConn, h header.Header, body []byte) {
	if h.Stream != 0 {
		g.refuseLAN(c, "LAN OPEN must use stream 0", "stream", h.Stream)
		return
	}
	o, err := header.ParseOpen(body)
	if err != nil {
		g.refuseLAN(c, "bad OPEN", "err", err)
		return
	}
	o.Dst = unmapAP(o.Dst)
	o.Src = unmapAP(o.Src)
	if o.Src.Addr() != c.Remote().Addr() {
		g.refuseLAN(c, "OPEN source differs from the connection's source", "src", o.Src.String())
		return
	}
	dsite, ok := g.cfg.Map.Lookup(o.Dst.Addr())
	if !ok || dsite.ID == g.site.ID {
		g.refuseLAN(c, "destination is not in another site of the map", "dst", o.Dst.String())
		return
	}
	p := g.peers[dsite.ID]
	l := g.pickLink(p)
	if l == nil {
		g.refuseLAN(c, "no WAN link to the destination's site", "dst", o.Dst.String(), "peer", dsite.Name)
		return
	}
	s, err := l.Open(&o, c)
	if err != nil {
		g.refuseLAN(c, "open on WAN link failed", "err", err)
		return
	}
	g.m.streamsOpened.WithLabelValues(dsite.Name, "out").Inc()
	g.log.Debug("stream open", "dir", "out", "peer", dsite.Name, "stream", s.ID(), "src", o.Src.String(), "dst", o.Dst.String())
}

// openFromWAN handles a peer's OPEN: the destination must be a node of our
// site and the source a node of the peer's site. The connect runs on its own
// goroutine; DATA the peer pipelined waits in the stream's window meanwhile.
func (g *Gateway) openFromWAN(s *relay.Stream, o *header.Open) {
	peerID := s.Link().Peer().SiteID
	psite, _ := g.cfg.Map.SiteByID(peerID)
	if g.draining.Load() {
		s.Refuse(header.CodeShutdown)
		return
	}
	o.Dst, o.Src = unmapAP(o.Dst), unmapAP(o.Src)
	if d, ok := g.cfg.Map.Lookup(o.Dst.Addr()); !ok || d.ID != g.site.ID {
		g.log.Warn("WAN OPEN refused: destination not in this site", "peer", psite.Name, "dst", o.Dst.String())
		s.Refuse(header.CodePolicy)
		return
	}
	if src, ok := g.cfg.Map.Lookup(o.Src.Addr()); !ok || src.ID != peerID {
		g.log.Warn("WAN OPEN refused: source not in the peer's site", "peer", psite.Name, "src", o.Src.String())
		s.Refuse(header.CodePolicy)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(g.ctx, g.cfg.DialTimeout)
		defer cancel()
		var key recordKey
		c, err := g.lan.Dial(ctx, g.site.LAN.Addr(), o.Dst, func(local netip.AddrPort) {
			key = recordKey{local, o.Dst}
			g.records.put(key, record{src: o.Src, site: peerID})
		})
		if err != nil {
			if key.local.IsValid() {
				g.records.del(key)
			}
			code := dialCode(err)
			g.log.Info("destination connect failed", "dst", o.Dst.String(), "code", code.String(), "err", err)
			s.Refuse(code)
			return
		}
		if err := s.Accept(c); err != nil {
			c.Abort()
			g.records.del(key)
			return
		}
		g.m.streamsOpened.WithLabelValues(psite.Name, "in").Inc()
		<-s.Done()
		g.records.del(key)
	}()
}

func dialCode(err error) header.Code {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return header.CodeRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return header.CodeUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return header.CodeTimedOut
	case errors.Is(err, context.Canceled):
		return header.CodeShutdown
	}
	return header.CodeUnreachable
}

// serveQueries answers PEER_QUERY frames on a control connection until the
// node closes it.
func (g *Gateway) serveQueries(c LANConn, h header.Header, body []byte) {
	defer c.Close()
	r := header.NewReader(c, 4096)
	var buf [64]byte
	out := make([]byte, 0, header.Size+32)
	for {
		if h.Type != header.TypePeerQuery {
			g.refuseLAN(c, "control connection carries only PEER_QUERY", "type", h.Type.String())
			return
		}
		q, err := header.ParsePeerQuery(body)
		if err != nil {
			g.refuseLAN(c, "bad PEER_QUERY", "err", err)
			return
		}
		rec, found := g.records.get(recordKey{unmapAP(q.Seen), unmapAP(q.Local)})
		rep := header.PeerReply{Found: found, SiteID: rec.site, Source: rec.src}
		out = header.AppendPeerReply(out[:header.Size], &rep)
		header.Header{Type: header.TypePeerReply, Stream: h.Stream, Length: uint32(len(out) - header.Size)}.Encode(out)
		if _, err := c.Write(out); err != nil {
			return
		}
		g.m.peerQueries.WithLabelValues(fmt.Sprint(found)).Inc()
		h, body, err = r.ReadFrame(buf[:])
		if err != nil {
			if !errors.Is(err, io.EOF) {
				g.refuseLAN(c, "control connection", "err", err)
			}
			return
		}
	}
}

// ---- true-source records for PEER_QUERY ----

type recordKey struct{ local, dst netip.AddrPort }

type record struct {
	src  netip.AddrPort
	site uint8
}

type peerTable struct {
	mu sync.Mutex
	m  map[recordKey]record
}

func (t *peerTable) put(k recordKey, r record) {
	t.mu.Lock()
	t.m[k] = r
	t.mu.Unlock()
}

func (t *peerTable) del(k recordKey) {
	t.mu.Lock()
	delete(t.m, k)
	t.mu.Unlock()
}

func (t *peerTable) get(k recordKey) (record, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.m[k]
	return r, ok
}
