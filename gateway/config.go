package gateway

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/seal"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tuning"
	"github.com/mpi5k/mpi5k/units"
)

// Config configures a gateway, its settings grouped by concern in the
// structs it embeds: their fields read as Config's own (cfg.MaxLANConns),
// and a composite literal names the group (Config{LimitsConfig:
// LimitsConfig{MaxLANConns: 64}}).
// The zero value of a numeric field means its default, which New fills
// in; a zero boolean turns its feature off, so start from DefaultConfig,
// which holds what the measurements settled (the mpi5k-gateway defaults).
// New calls Validate.
type Config struct {
	Map  *sitemap.Map
	Site string // this gateway's site
	// ListenLAN, ListenWAN (--lan, --wan) say which of the site's gateway
	// hosts this is when the map lists several (identity.go); unset, the
	// site's only one, or the one whose addresses are this host's.
	ListenLAN, ListenWAN netip.AddrPort

	LANConfig
	WANConfig
	TuningConfig
	LimitsConfig // limits.go
	ServiceConfig
}

// LANConfig is the site's side of a gateway: how its nodes reach it and
// how it reaches their ranks.
type LANConfig struct {
	LAN tuning.SockOpts // options of LAN sockets

	Transport LANTransport // nil = LANTransport below
	// LANTransport picks the LAN transport when Transport is nil: "tcp"
	// (kernel TCP with the LAN options, the default) or "mx" (MX-style
	// messaging in raw Ethernet frames on LANIf; the site's nodes then need
	// an MX endpoint, docs/architecture.md).
	LANTransport string
	LANIf        string
	// LANForward is how streams on a LAN transport without kernel
	// sockets (mx) are forwarded: "chunked" or "pipelined" (two-buffer
	// forwarding, lan_mx_pipe.go).
	LANForward string

	// ListenPorts are the ports a rank may register (LISTEN) on its host
	// (--lan-listen-ports; nil: DefaultListenPorts). The gateway cannot
	// see which process holds a port of a node, so a LISTEN for a port
	// outside them is refused (listen_port): another user's service on the
	// node stays out of reach whoever asks (docs/security.md).
	ListenPorts PortSet

	DialTimeout time.Duration // LAN connect to a destination (default 10 s)
	FirstFrame  time.Duration // how long a LAN connection may take to send OPEN/PEER_QUERY/LISTEN (default 10 s)
}

// WANConfig is the links to the other sites' gateways: their sockets and
// connections, their keys, their keepalives and resumption, and what a
// stream from another site may reach.
type WANConfig struct {
	WAN      tuning.SockOpts // options of WAN sockets (NotSentLowat defaults to 128 KiB, CC to bbr when available)
	WANConns int             // parallel bulk links per site pair (default 1); large writes are striped over them
	// WANPace caps each site pair's bulk WAN sending rate (bit/s, shared
	// evenly by its WANConns bulk links, which one stream's chunks are
	// striped over; the express link is not capped; 0 = no cap). Set a few
	// percent below the WAN bottleneck, it keeps the bottleneck queue
	// empty: the bulk of one stream then adds no queueing delay and no
	// drop-tail losses to the small messages of the others. It is meant for
	// a WAN the site pair has to itself: against competing flows a capped
	// link only loses its share.
	WANPace uint64

	// KeyFile is this gateway's Ed25519 private key (GenerateKey), needed
	// when the map lists gateway keys: the WAN links are then mutually
	// authenticated with TLS 1.3 and carry sealed records (docs/security.md). Key,
	// if set, is used instead of reading KeyFile.
	KeyFile string
	Key     ed25519.PrivateKey
	// WANIntegrityOnly (--wan-encrypt=false): with keys, WAN records are
	// authenticated but not encrypted, for a WAN the operator already
	// protects. Both ends must agree.
	WANIntegrityOnly bool
	// KeyUpdate bounds what one key of a WAN link's records seals before
	// the sender moves to the next (mpi5k/3 records, docs/security.md):
	// zero fields are seal.DefaultLimits', and no field goes past them.
	// A tuning knob for tests, which force updates every few records.
	KeyUpdate seal.Limits
	// fixedKeys makes the gateway offer mpi5k/2 records alone, whose keys
	// never change, as a build before key updates: tests of mixed builds.
	fixedKeys bool

	// AllowPorts is the destination policy: the ports of this site's hosts
	// that streams from other sites may reach besides those where ranks
	// listen (listeners.go); nil or empty: none.
	// Any other port is refused (OPEN_REFUSED, policy; counted as
	// dst_port).
	AllowPorts PortSet

	OpenTimeout  time.Duration // how long an OPEN waits for a WAN link (default 2 s)
	PingInterval time.Duration // WAN keepalive of a busy link (default 1 s); an idle one with streams pings about every DeadAfter/3 (relay/keep.go), one without is left to TCP keepalive (relay/quiet.go)
	DeadAfter    time.Duration // a link silent this long is dead; also TCP_USER_TIMEOUT (default 10 × PingInterval)
	// ResumeWithin is how long a broken WAN link may take to resume on a
	// new connection before the streams through it are reset (0: links do
	// not resume; a break resets them at once). Both gateways of a pair
	// must agree on whether links resume.
	ResumeWithin time.Duration
	// ReplayMax is the bulk bytes a resuming link keeps until the peer
	// acknowledges them (0: 16 MiB): above the path's bandwidth-delay
	// product, or it limits the link's rate.
	ReplayMax int
	// RetireTimeout: how long the streams of a peer that a reload took out
	// of the map may finish before its links close (default 10 min).
	RetireTimeout time.Duration
}

// TuningConfig is what the measurements decided (package relay's
// figures, bench/figures): how the links carry bulk and messages, and how
// the gateway waits for its sockets. DefaultConfig turns each feature on;
// the flags keep them for experiments.
type TuningConfig struct {
	// Trunk names the preset these settings started from (--wan-trunk):
	// TrunkShared (DefaultConfig) or TrunkParallel, or TrunkAuto in the
	// settings `mpi5k run` checks for remote gateways, which resolve it on
	// their hosts; it is what the gateway logs and names when a peer's
	// links differ from its own.
	Trunk string
	// TrunkCC is the host's default congestion control that chose Trunk
	// for --wan-trunk auto ("" when the preset was given).
	TrunkCC string
	// TrunkAlt, with --wan-trunk auto resolved (Flags.Config), is the
	// settings under the preset auto did not pick, of which the gateway
	// takes the trunk's (WANConns and TuningConfig): the site pairs that
	// agree on that preset run them (trunk.go, agree). nil: every pair
	// runs Trunk, and a peer that runs another preset is refused.
	TrunkAlt *Config

	Chunk  int    // DATA chunk (default 128 KiB)
	Window uint32 // per-stream receive window (default 4 MiB)
	// Stripe spreads a stream's bulk over every bulk link of its site
	// pair; without it a stream's bulk stays on the link that homes it, as
	// a rank pair's own TCP connection would carry it (relay.Config.NoStripe).
	Stripe bool
	// Express gives every site pair one more WAN connection that carries
	// only messages (bursts of up to ExpressMax bytes), so a small message
	// never waits behind bulk bytes queued in a bulk link's socket (see
	// package relay, figure (d)).
	Express bool
	// ExpressCC is the congestion control of the express link ("" = CUBIC
	// when --wan-cc is set, else the WAN sockets' CC).
	ExpressCC string
	// ExpressMax is the largest burst counted as a message (0 = 68 KiB, or
	// the chunk if smaller): it takes the express link.
	ExpressMax int
	// Renew replaces an express link whose congestion window losses have
	// cut below one message (ExpressMax) with a fresh connection: the link
	// carries app-limited messages, which never regrow a window that loss
	// recovery has cut (see package relay, renewal). Both gateways of a
	// pair must agree.
	Renew bool
	// ExpressYield holds the express link aside (relay.Trunk.HoldExpress)
	// while another flow keeps the WAN queue full: when losses have cut
	// the express link's window below one message and its min RTT
	// stands well above the path's (see tuning.ExpressControl), this side's
	// messages take the bulk links for 10 s, doubling up to a minute
	// while it recurs. Each side decides for what it sends.
	ExpressYield bool
	// WANQueue turns on queue control on the bulk links (0 = off;
	// DefaultConfig: 1 ms): a link that saturates the WAN keeps about this
	// much queue at the bottleneck, by capping the peer's receive window at
	// the measured rate x (min RTT + WANQueue), and lifts the cap while
	// another flow keeps the queue full (see package relay, queue control).
	WANQueue time.Duration
	// ProbeRTTGuard idles a busy BBR bulk link across its min_rtt filter's
	// expiry (tuning.ProbeGuard), which BBR then takes as a restart from idle
	// instead of a dip into PROBE_RTT (cwnd 4 for 200 ms every 10 s of
	// bulk).
	ProbeRTTGuard bool
	// Prime fills a new BBR WAN link with PAD frames until BBR leaves
	// STARTUP, since BBR paces app-limited messages at the rate of earlier
	// ones and grows a low estimate by only 25 % per eight round trips (see
	// tuning.Prime). CUBIC and Reno links are never primed.
	Prime bool
	// KeepWarm checks net.ipv4.tcp_slow_start_after_idle in the gateway's
	// network namespace if any WAN socket runs a CC other than BBR, and
	// warns with the fix when it is not 0: a CUBIC express link then
	// restarts from 10 segments after every pause longer than its RTO (see
	// tuning.WarmState). The gateway never writes it; the service unit does, and
	// restores it on every stop.
	KeepWarm bool
	// PollThread waits for idle sockets on the relay's poller thread,
	// which forwards small messages with one thread wake-up per gateway
	// (see package relay, figure (a)); off, Go's network poller waits.
	PollThread bool
	// QuietRuntime takes the input of sockets the poller thread owns out
	// of Go's runtime epoll registration (package relay, rtquiet.go), so an
	// arriving message wakes one thread, not two.
	QuietRuntime bool
	// Priority is the nice value the gateway process asks for at start
	// (RaisePriority; mpi5k-gateway applies it, not New, since it is the
	// whole process's). 0 keeps the inherited priority.
	Priority int
}

// ServiceConfig is the gateway as a service: its log, how it tells that
// it is ready and how it is watched, and how it stops.
type ServiceConfig struct {
	Logger *slog.Logger

	ReadyFile   string // written once every WAN link is up and primed (tuning.Prime)
	MetricsAddr string // HTTP listener for /metrics and /ready ("" = none; no host = loopback)
	// ReadyTag names the job a per-job gateway serves: /ready?tag=X
	// answers 409 unless X is this tag (mpi5k run's check that the
	// gateway on a port is the one it started).
	ReadyTag string
	// CPUProfile, when set, is a directory the gateway writes a CPU
	// profile of its whole run to (profile.go): a measuring tool.
	CPUProfile string

	DrainTimeout time.Duration // SIGTERM: how long streams may finish (default 10 s)
}

// DefaultConfig is the configuration the measurements settled on (package
// relay's figures, bench/figures): the shared preset, the defaults of
// mpi5k-gateway and of `mpi5k run`'s gateways on a host whose TCP is not
// BBR (their --wan-trunk is auto). Map, Site and Logger are the caller's.
func DefaultConfig() Config {
	return Config{
		LANConfig: LANConfig{
			LANTransport: "tcp",
			LANForward:   LANForwardChunked,
			ListenPorts:  DefaultListenPorts,
		},
		WANConfig: WANConfig{
			WAN:          tuning.SockOpts{NotSentLowat: 128 << 10, RTOMin: 10 * time.Millisecond, DelackMax: 5 * time.Millisecond},
			WANConns:     1,
			AllowPorts:   DefaultAllowPorts,
			ResumeWithin: time.Minute,
		},
		TuningConfig: TuningConfig{
			Trunk: TrunkShared,
			Chunk: 128 << 10, Window: 4 << 20, Stripe: true,
			Express: true, Renew: true, ExpressYield: true, ProbeRTTGuard: true, Prime: true, KeepWarm: true,
			PollThread: true, QuietRuntime: true, WANQueue: time.Millisecond,
		},
	}
}

// Validate reports the first setting out of range, named by its
// mpi5k-gateway flag. Zero numbers are valid: New gives them defaults. It
// reads nothing from the kernel, so `mpi5k run` checks the remote
// gateways' settings with it before it starts any.
func (c *Config) Validate() error {
	if c.Trunk != "" && !slices.Contains(trunkWords, c.Trunk) {
		return fmt.Errorf("--wan-trunk %q: want %s", c.Trunk, strings.Join(trunkWords, ", "))
	}
	switch c.LANTransport {
	case "", "tcp":
	case "mx":
		if c.LANIf == "" {
			return fmt.Errorf("--lan-transport mx needs --lan-if, the gateway's interface on the site LAN (e.g. eth0)")
		}
	default:
		return fmt.Errorf("--lan-transport %q: want tcp or mx", c.LANTransport)
	}
	switch c.LANForward {
	case "", LANForwardChunked:
	case LANForwardPipelined:
		if c.LANTransport != "mx" && c.Transport == nil {
			return fmt.Errorf("--lan-forward %s applies to --lan-transport mx only (kernel TCP sockets are forwarded by the poll thread); drop it or add --lan-transport mx", c.LANForward)
		}
	default:
		return fmt.Errorf("--lan-forward %q: want %s or %s", c.LANForward, LANForwardChunked, LANForwardPipelined)
	}
	if c.Chunk < 0 || c.Chunk > header.MaxPayload {
		return fmt.Errorf("--chunk %s out of range 1..%s", units.FormatSize(c.Chunk), units.FormatSize(header.MaxPayload))
	}
	if c.WANConns < 0 || c.WANConns > maxWANConns {
		return fmt.Errorf("--wan-conns %d out of range 1..%d", c.WANConns, maxWANConns)
	}
	if c.WANQueue < 0 {
		return fmt.Errorf("--wan-queue %v is negative (0 turns queue control off)", c.WANQueue)
	}
	if conns := uint64(max(c.WANConns, 1)); c.WANPace > 0 && c.WANPace < 8000*conns {
		return fmt.Errorf("--wan-pace %d bit/s is below 8 kbit/s per WAN connection (%d connections)", c.WANPace, conns)
	}
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{{"--wan-rto-min", c.WAN.RTOMin}, {"--wan-delack-max", c.WAN.DelackMax}} {
		if t.d < 0 || t.d > maxTCPTimer {
			return fmt.Errorf("%s %v out of range 0..%v (0 keeps the kernel's 200ms)", t.flag, t.d, maxTCPTimer)
		}
	}
	chunk := c.Chunk
	if chunk == 0 {
		chunk = 128 << 10
	}
	if c.ExpressMax < 0 || c.ExpressMax > chunk {
		return fmt.Errorf("--express-max %s out of range 0..%s (the chunk, --chunk)", units.FormatSize(c.ExpressMax), units.FormatSize(chunk))
	}
	return c.checkLimits()
}

const (
	maxWANConns = 63 // bulk links per site pair (the limit New has always applied)
	// maxTCPTimer is the largest TCP_RTO_MIN_US and TCP_DELACK_MAX_US the
	// kernel takes (its own 200 ms defaults).
	maxTCPTimer = 200 * time.Millisecond
)

// fillDefaults gives zero settings the defaults Config's fields document,
// but for what depends on the kernel (checkKernel: the congestion
// controls, the TCP timers).
func (c *Config) fillDefaults() {
	if c.Chunk == 0 {
		c.Chunk = 128 << 10
	}
	if c.Window == 0 {
		// One stream must be able to fill the WAN: 4 MiB covers 1 Gbit/s at
		// 30 ms RTT. Memory is only used while a destination reads slower
		// than the WAN delivers (bound: streams x window).
		c.Window = 4 << 20
	}
	if c.WANConns == 0 {
		c.WANConns = 1
	}
	if c.WANPace > 0 {
		c.WAN.MaxPacingRate = c.WANPace / 8 / uint64(c.WANConns)
	}
	if c.WAN.NotSentLowat == 0 {
		c.WAN.NotSentLowat = 128 << 10
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = 2 * time.Second
	}
	if c.PingInterval == 0 {
		c.PingInterval = time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.RetireTimeout == 0 {
		c.RetireTimeout = defaultRetireTimeout
	}
	if c.FirstFrame == 0 {
		c.FirstFrame = 10 * time.Second
	}
	if c.DeadAfter == 0 {
		// Long enough that a WAN hiccup (or a starved emulator) does not kill
		// every stream of a long MPI job; a connection that is reset fails
		// its streams at once regardless.
		c.DeadAfter = 10 * c.PingInterval
	}
	c.WAN.ThinLinear = true
	if c.WAN.UserTimeout == 0 {
		// A link whose data stays unacknowledged this long is dead even if
		// keepalives are stuck behind it.
		c.WAN.UserTimeout = c.DeadAfter
	}
	if c.ExpressMax == 0 {
		// Open MPI's TCP eager fragments are 64 KiB plus the BTL's header:
		// a latency-bound message of up to 64 KiB is one small burst.
		c.ExpressMax = min(68<<10, c.Chunk)
	}
}

// relayConfig is what the relay's links get of c (defaults filled, limits
// too), with package tuning's WAN policies plugged into the relay's hooks
// for them. log and limited are the gateway's.
func (c *Config) relayConfig(log *slog.Logger, limited func(reason, peer string, err error)) relay.Config {
	rc := relay.Config{Chunk: c.Chunk, Window: c.Window, ExpressMax: c.ExpressMax, NoStripe: !c.Stripe,
		PingInterval: c.PingInterval, DeadAfter: c.DeadAfter, Logger: log,
		NoPoller: !c.PollThread, RuntimeWakes: !c.QuietRuntime,
		MaxControl: c.MaxControl, MaxEarly: c.MaxEarly,
		ReplayMax: int64(c.ReplayMax), ResumeWithin: c.ResumeWithin,
		Limited: limited}
	// The WAN policies, each in the hook of its kind: queue control caps
	// the bulk links, express control renews and holds the express link.
	rc.QueueControl = tuning.QueueControl(c.WANQueue)
	if c.Express {
		rc.ExpressControl = tuning.ExpressControl(c.Renew, c.ExpressYield, c.ExpressMax)
	}
	return rc
}
