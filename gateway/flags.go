package gateway

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/tuning"
)

// Flags declares the gateway's settings on a command line, once:
// mpi5k-gateway parses them into its Config, and `mpi5k run` takes the
// same flags and forwards the ones the user gave (Args) to every gateway
// it starts. Each value is checked as it is parsed.
type Flags struct {
	cfg    Config
	window int    // Config.Window is a uint32
	trunk  string // --wan-trunk, applied by Config
	remote bool
	fs     *pflag.FlagSet
	names  []string
}

// NewFlags registers the gateway's settings on fs, defaults from
// DefaultConfig but --wan-trunk, whose default is auto. remote: the
// gateways run on other hosts (`mpi5k run`), whose kernels decide which
// congestion controls exist, so names are checked against Linux's list;
// otherwise against this kernel's.
func NewFlags(fs *pflag.FlagSet, remote bool) *Flags {
	f := &Flags{cfg: DefaultConfig(), fs: fs, remote: remote}
	f.window, f.trunk = int(f.cfg.Window), TrunkAuto
	checkCC := tuning.CheckCC
	if remote {
		checkCC = tuning.CheckCCName
	}
	c := &f.cfg
	cc := func(p *string) pflag.Value { return cli.Checked{P: p, Check: checkCC} }
	size := func(p *int, min, max int) pflag.Value { return &cli.Size{P: p, Min: min, Max: max} }
	const gib = 1 << 30
	add := func(v pflag.Value, name, usage string) { fs.Var(v, name, usage); f.names = append(f.names, name) }
	addBool := func(p *bool, name, usage string) {
		fs.BoolVar(p, name, *p, usage)
		f.names = append(f.names, name)
	}

	// What a user sets: the WAN's congestion control, how many
	// connections share it, how much a stream may have in flight, a rate cap.
	add(cli.Choice{P: &f.trunk, Words: trunkWords}, "wan-trunk",
		"how a site pair's streams share the WAN: shared (one warm aggregated link plus an express link for messages; wins on CUBIC hosts and idle WANs), parallel (a BBR link per stream, up to 8, as the ranks' own connections; wins on BBR hosts beside other flows), auto (picks parallel where the gateway host's default TCP is bbr, else shared, and agrees with each peer gateway: a peer's shared or parallel is taken, two auto picks that differ take shared); flags given with it win. Gateways that give shared and parallel refuse each other")
	add(cc(&c.WAN.CC), "wan-cc", "TCP congestion control of the WAN links (default: bbr if the kernel has it, else the system's)")
	add(cli.IntRange{P: &c.WANConns, Min: 1, Max: maxWANConns, What: "bulk WAN connections"}, "wan-conns",
		"parallel bulk WAN connections per site pair, large writes striped over them (the same on every gateway)")
	add(size(&f.window, 1, gib), "window", "per-stream receive window granted to peers (far-side memory bound: streams x window)")
	add(cli.Duration{P: &c.ResumeWithin}, "wan-resume-within", "how long a broken WAN connection may take to resume on a new one, its streams paused, before they are reset (0: no resume, reset at once; the same on or off on every gateway)")
	add(portFlag{&c.ListenPorts}, "lan-listen-ports", "ports of this site's hosts a rank may open to other sites by listening there (LISTEN; default: Linux's default ephemeral range, set it to the nodes' ip_local_port_range; any: every unprivileged port, which lets a user of a node open other users' services on it; none: only --wan-allow-ports)")
	add(portFlag{&c.AllowPorts}, "wan-allow-ports", "ports of this site's hosts that streams from other sites may reach even where no rank listens, e.g. 32768-60999,5201 (any: every port; default none: only where the job's ranks listen)")
	add(cli.Not{P: &c.WANIntegrityOnly}, "wan-encrypt", "encrypt the WAN links (when the site map lists gateway keys); false: authenticate them only, for a WAN the operator already protects, an altered byte still detected and never delivered (the same on every gateway)")
	fs.Lookup("wan-encrypt").NoOptDefVal = "true"
	add(&cli.Rate{P: &c.WANPace}, "wan-pace", "cap each site pair's bulk WAN sending rate, e.g. 190mbit (0: no cap); a few percent below the WAN bottleneck keeps its queue empty")

	// The rest: settings the measurements decided (package relay's
	// figures, bench/figures), kept for experiments.
	adv := len(f.names)
	add(cc(&c.LAN.CC), "lan-cc", "TCP congestion control of LAN sockets (default: the system's)")
	add(size(&c.LAN.SndBuf, 0, gib), "lan-sndbuf", "SO_SNDBUF of LAN sockets (0: autotuning)")
	add(size(&c.LAN.RcvBuf, 0, gib), "lan-rcvbuf", "SO_RCVBUF of LAN sockets (0: autotuning)")
	add(size(&c.WAN.SndBuf, 0, gib), "wan-sndbuf", "SO_SNDBUF of WAN sockets (0: autotuning)")
	add(size(&c.WAN.RcvBuf, 0, gib), "wan-rcvbuf", "SO_RCVBUF of WAN sockets (0: autotuning)")
	add(size(&c.WAN.NotSentLowat, 1, gib), "wan-notsent-lowat", "TCP_NOTSENT_LOWAT of WAN sockets: unsent bytes a WAN socket keeps")
	add(size(&c.Chunk, 1, header.MaxPayload), "chunk", "largest DATA frame on the WAN")
	addBool(&c.Stripe, "wan-stripe", "spread each stream's bulk over every bulk link of its site pair (--wan-conns); false keeps it on one link, as the rank pair's own connection would")
	addBool(&c.Express, "wan-express", "one more WAN connection per site pair for small frames only, so they never wait behind bulk (the same on every gateway)")
	add(cc(&c.ExpressCC), "wan-express-cc", "congestion control of the express link (default: cubic)")
	addBool(&c.Renew, "wan-express-renew", "replace the express link with a fresh connection when losses have cut its congestion window below one --express-max message (the same on every gateway)")
	addBool(&c.ExpressYield, "wan-express-yield", "send messages on the bulk links for a while (10s, doubling to 1m while it recurs) when another flow keeps the WAN queue full and losses have cut the express link's window below one --express-max message")
	add(size(&c.ExpressMax, 0, header.MaxPayload), "express-max", "largest message (burst a rank writes without pausing) that takes the express link, at most --chunk (0: 68KiB, or --chunk if smaller)")
	add(cli.Duration{P: &c.WANQueue}, "wan-queue", "queue control: WAN bottleneck queue a saturating bulk link may keep, by capping the peer's receive window at measured rate x (min RTT + this) (0: off)")
	add(cli.Duration{P: &c.WAN.RTOMin}, "wan-rto-min", "floor of WAN sockets' retransmission timeout, TCP_RTO_MIN_US, at most 200ms (0: the kernel's 200ms)")
	add(cli.Duration{P: &c.WAN.DelackMax}, "wan-delack-max", "longest a WAN socket delays an ACK, TCP_DELACK_MAX_US, at most 200ms (0: the kernel's 200ms)")
	addBool(&c.ProbeRTTGuard, "wan-skip-probe-rtt", "idle a busy BBR bulk link for a few ms across its min_rtt filter's expiry, so BBR restarts from idle instead of cutting cwnd to 4 for 200ms (PROBE_RTT) every 10s of bulk")
	addBool(&c.Prime, "wan-prime", "fill each new BBR WAN link with filler until BBR has measured the path, so it does not pace messages at the rate of earlier small ones")
	addBool(&c.KeepWarm, "wan-keep-warm", "check that TCP slow start after idle (net.ipv4.tcp_slow_start_after_idle) is off when a WAN socket is not BBR, and warn with the fix if not (the gateway changes no host setting; the service unit sets it and restores it)")
	add(size(&c.ReplayMax, 0, gib), "wan-replay", "bulk bytes a WAN link keeps until the peer acknowledges them, to resend after a break (0: 16MiB); keep it above the WAN's bandwidth-delay product")
	add(cli.Choice{P: &c.LANTransport, Words: []string{"tcp", "mx"}}, "lan-transport",
		"LAN transport between the site's nodes and the gateway: tcp (kernel TCP) or mx (MX-style messages in raw Ethernet frames, needs --lan-if and CAP_NET_RAW)")
	add(cli.Checked{P: &c.LANIf, Check: func(string) error { return nil }}, "lan-if", "the gateway's interface on the site LAN, for --lan-transport mx")
	add(cli.Choice{P: &c.LANForward, Words: lanForwardModes}, "lan-forward",
		"how streams on --lan-transport mx are forwarded: chunked (a chunk at a time: read, then send) or pipelined (two buffers: the next is received while the last is sent, sent toward the node without a copy; measured no faster, and slower toward the node, bench/figures/mx)")
	addBool(&c.PollThread, "poll-thread", "forward small messages on one event-loop thread that waits for every idle socket (false: Go's network poller)")
	addBool(&c.QuietRuntime, "quiet-runtime", "take sockets the poll thread waits for out of Go's runtime epoll registration, so a message wakes one thread, not two")
	add(cli.IntRange{P: &c.Priority, Min: -20, Max: 19, What: "nice value"}, "priority",
		"nice value the gateway asks for, so it forwards at once beside ranks that compute on its host (needs CAP_SYS_NICE or RLIMIT_NICE below 0; without, a warning and the inherited priority; 0: keep it)")
	add(cli.Checked{P: &c.CPUProfile, Check: absDir}, "cpu-profile",
		"write a CPU profile of the gateway's whole run to this directory on its host, cpu-<site>-<pid>.pprof (go tool pprof), to see where its CPU goes; an absolute path")
	cli.MarkAdvanced(fs, f.names[adv:]...)
	return f
}

// absDir checks --cpu-profile: the gateways of `mpi5k run` start in
// other working directories, on other hosts.
func absDir(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q is not an absolute path (the gateways start elsewhere): give one, e.g. /tmp/prof", p)
	}
	return nil
}

// Has reports whether name is one of the gateway's flags.
func (f *Flags) Has(name string) bool { return slices.Contains(f.names, name) }

// Config returns the settings parsed, started from the --wan-trunk
// preset and checked together (Validate); the caller adds Map, Site and
// the rest. A local gateway resolves auto by its host's congestion
// control (TrunkCC says which) and keeps the other preset's settings in
// TrunkAlt for the site pairs that agree on it; for remote gateways,
// which resolve it on their own hosts, both outcomes are checked and
// Trunk stays auto.
func (f *Flags) Config() (Config, error) {
	c := f.cfg
	c.Window = uint32(f.window)
	given := func(name string) bool { return f.fs.Lookup(name).Changed }
	// at is c started from preset, and what Validate says of it.
	at := func(preset string) (Config, error) {
		p := c
		applyTrunk(&p, preset, given)
		return p, p.Validate()
	}
	if f.trunk == TrunkAuto && f.remote {
		for _, preset := range []string{TrunkShared, TrunkParallel} {
			if _, err := at(preset); err != nil {
				return Config{}, fmt.Errorf("%w (with --wan-trunk auto, where it picks %s)", err, preset)
			}
		}
		c.Trunk = TrunkAuto
		return c, nil
	}
	preset, cc, err := resolveTrunk(f.trunk)
	if err != nil {
		return Config{}, err
	}
	mine, err := at(preset)
	mine.TrunkCC = cc
	if cc != "" {
		alt, aerr := at(otherTrunk(preset))
		if aerr != nil {
			return Config{}, fmt.Errorf("%w (with --wan-trunk auto, where a site pair agrees on %s)", aerr, alt.Trunk)
		}
		mine.TrunkAlt = &alt
	}
	return mine, err
}

// Args renders the settings the user gave as gateway arguments, in the
// order they were declared: what `mpi5k run` appends to each gateway's
// command line.
func (f *Flags) Args() []string {
	var out []string
	for _, name := range f.names {
		if fl := f.fs.Lookup(name); fl.Changed {
			out = append(out, "--"+name+"="+fl.Value.String())
		}
	}
	return out
}
