package gateway

// The presets of --wan-trunk: how a site pair's streams share the WAN.
// bench/figures/competing holds the measurements that chose them: the
// shared trunk wins where the site's hosts run CUBIC (beside any
// neighbour) and on an idle WAN; a BBR connection per stream, with none
// of the trunk's controls, wins on BBR hosts beside BBR flows.
//
// Each site pair agrees on one preset (agree): the HELLO says which the
// sender runs and whether it runs auto (header.ExtTrunk). A pair keeps
// its layout (layout) while it has a link, and takes the agreed one when
// it has none (adopt); a dialer whose link index the agreed layout does
// not have parks that link's dial loop (parked).

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
)

const (
	// TrunkShared is DefaultConfig: every stream of a site pair over one
	// warm bulk link, queue-controlled, primed and kept out of PROBE_RTT,
	// its messages over the express link beside it.
	TrunkShared = "shared"
	// TrunkParallel homes each stream on one of parallelLinks bulk links
	// of its own congestion control (--wan-cc, BBR where the kernel has
	// it), as the rank pair's own connection would be, with no express
	// link, no striping, queue control, priming or PROBE_RTT guard, and
	// Go's network poller in place of the poll thread. It keeps the WAN
	// sockets' short timers (--wan-rto-min, --wan-delack-max).
	TrunkParallel = "parallel"
	// TrunkAuto picks TrunkParallel on a gateway whose host runs BBR by
	// default (net.ipv4.tcp_congestion_control), TrunkShared elsewhere
	// (the gateway host is taken to run what the site's nodes run), and
	// takes the preset of a peer that runs one; two auto gateways whose
	// picks differ take TrunkShared, the one measured faster beside
	// CUBIC hosts.
	TrunkAuto = "auto"
)

var trunkWords = []string{TrunkShared, TrunkParallel, TrunkAuto}

// parallelLinks is TrunkParallel's bulk links per site pair: one per
// stream for up to 8 cross-site rank pairs, as measured.
const parallelLinks = 8

// parallelTrunk is what TrunkParallel changes from DefaultConfig, each
// under the flag that sets it, so a flag the user gives wins.
var parallelTrunk = []struct {
	flag string
	set  func(*Config)
}{
	{"wan-conns", func(c *Config) { c.WANConns = parallelLinks }},
	{"wan-stripe", func(c *Config) { c.Stripe = false }},
	{"wan-express", func(c *Config) { c.Express = false }},
	{"wan-prime", func(c *Config) { c.Prime = false }},
	{"wan-queue", func(c *Config) { c.WANQueue = 0 }},
	{"wan-skip-probe-rtt", func(c *Config) { c.ProbeRTTGuard = false }},
	{"poll-thread", func(c *Config) { c.PollThread = false }},
}

// hostCC reads the default TCP congestion control of the gateway's
// network namespace; a variable for tests.
var hostCC = func() (string, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// autoTrunk is TrunkAuto's choice on a host whose default congestion
// control is cc.
func autoTrunk(cc string) string {
	if cc == "bbr" {
		return TrunkParallel
	}
	return TrunkShared
}

// otherTrunk is the preset auto did not pick.
func otherTrunk(preset string) string {
	if preset == TrunkParallel {
		return TrunkShared
	}
	return TrunkParallel
}

// resolveTrunk is the preset TrunkAuto stands for on this host, and the
// host's congestion control it was chosen by ("" when trunk is not auto).
func resolveTrunk(trunk string) (preset, cc string, err error) {
	if trunk != TrunkAuto {
		return trunk, "", nil
	}
	cc, err = hostCC()
	if err == nil && cc == "" {
		err = errors.New("it reads empty")
	}
	if err != nil {
		return "", "", fmt.Errorf("--wan-trunk auto: cannot read this host's TCP congestion control (%v): give --wan-trunk shared or parallel", err)
	}
	return autoTrunk(cc), cc, nil
}

// applyTrunk starts c from preset; given reports the flags the user set,
// whose values stay.
func applyTrunk(c *Config, preset string, given func(flag string) bool) {
	c.Trunk = preset
	if preset != TrunkParallel {
		return
	}
	for _, p := range parallelTrunk {
		if !given(p.flag) {
			p.set(c)
		}
	}
}

// layout is a site pair's links under one preset, as this gateway's
// settings make them.
type layout struct {
	preset  string // TrunkShared or TrunkParallel
	conns   int    // bulk links, indices 0..conns-1
	express bool   // the express link, index conns
	renew   bool   // it is renewed when it goes cold
	prime   bool   // new links are primed
	guard   bool   // the PROBE_RTT guard watches the bulk links
	rcfg    relay.Config
}

// newLayout is the layout c's settings make; rc is the links' settings.
func newLayout(c *Config, rc relay.Config) *layout {
	preset := c.Trunk
	if preset != TrunkParallel {
		preset = TrunkShared // also a Config made without a preset
	}
	return &layout{preset: preset, conns: c.WANConns, express: c.Express, renew: c.Express && c.Renew,
		prime: c.Prime, guard: c.ProbeRTTGuard, rcfg: rc}
}

func (l *layout) numLinks() int {
	if l.express {
		return l.conns + 1
	}
	return l.conns
}

func (l *layout) isExpress(i int) bool { return l.express && i == l.conns }

// wire is the preset as ExtTrunk says it.
func (l *layout) wire() uint8 {
	if l.preset == TrunkParallel {
		return header.TrunkParallel
	}
	return header.TrunkShared
}

// presetOf names ExtTrunk's preset.
func presetOf(v uint8) string {
	if v == header.TrunkParallel {
		return TrunkParallel
	}
	return TrunkShared
}

// layouts are the gateway's layouts: its own, and under auto the other.
func (g *Gateway) layouts() []*layout {
	if g.alt == nil {
		return []*layout{g.mine}
	}
	return []*layout{g.mine, g.alt}
}

// anyLayout tells whether f holds for one of the gateway's layouts.
func (g *Gateway) anyLayout(f func(*layout) bool) bool {
	return slices.ContainsFunc(g.layouts(), f)
}

// maxLinks is the most links a site pair can have under the layouts.
func (g *Gateway) maxLinks() int {
	n := 0
	for _, l := range g.layouts() {
		n = max(n, l.numLinks())
	}
	return n
}

// agree is the layout of the site pair whose other gateway sent h: the
// preset both run; a fixed side's when the other runs auto; TrunkShared
// when both run auto and picked differently. Two fixed presets that
// differ do not agree. A HELLO without ExtTrunk is taken at its links,
// which checkHello compares with ours.
func (g *Gateway) agree(h header.Hello) (*layout, error) {
	theirs := presetOf(h.Trunk)
	switch {
	case h.Trunk == 0 || theirs == g.mine.preset:
		return g.mine, nil
	case g.alt == nil && h.TrunkAuto:
		return g.mine, nil // the peer follows
	case g.alt == nil:
		return nil, fmt.Errorf("peer runs --wan-trunk %s, we run %s: give every gateway the same --wan-trunk, or auto, which takes the preset of a peer that gives one", theirs, g.trunkSaid())
	case !h.TrunkAuto:
		return g.alt, nil // we follow
	case g.mine.preset == TrunkShared: // both auto, picks differ
		return g.mine, nil
	}
	return g.alt, nil
}

// states tells whether h's links are those of layout l.
func (g *Gateway) states(l *layout, h header.Hello) bool {
	return int(h.LinkCount) == l.numLinks() && h.Features&^header.FeatureNodeResume == g.features(l)&^header.FeatureNodeResume
}

// errParked: the link index is not in the site pair's agreed layout; its
// dial loop waits for the layout to change.
var errParked = errors.New("link index not in the agreed layout")

// adopt makes l the layout of p's site pair and holds it there until the
// caller, which adds link i of it, calls done; errParked (nothing held)
// when l has no link i. A pair changes layouts only while it has no link
// and none being added: a peer that restarted with another preset is
// taken once the links of the old one have failed, and a HELLO of another
// layout cannot slip in between another's adopt and its link.
func (g *Gateway) adopt(p *peer, l *layout, i int) (done func(), err error) {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if old := p.lay.Load(); old != l {
		if p.adding > 0 {
			return nil, fmt.Errorf("the pair with %s takes the %s trunk once the %s trunk's links being added have failed", p.name, l.preset, old.preset)
		}
		for j, x := range p.links {
			if x != nil {
				return nil, fmt.Errorf("the pair with %s takes the %s trunk once its %s trunk's link %d has failed", p.name, l.preset, old.preset, j)
			}
		}
		p.lay.Store(l)
		p.wake()
		g.log.Info("site pair trunk agreed", "peer", p.name, "trunk", l.preset, "was", old.preset, "links", l.numLinks(), "express", l.express)
	}
	if i >= l.numLinks() {
		return nil, errParked
	}
	p.adding++
	return func() {
		g.peersMu.Lock()
		p.adding--
		g.peersMu.Unlock()
	}, nil
}

// parked returns a channel closed when p's layout changes if link i is
// not in it, else nil.
func (g *Gateway) parked(p *peer, i int) <-chan struct{} {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if i < p.lay.Load().numLinks() {
		return nil
	}
	return p.layoutc
}
