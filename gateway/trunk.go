package gateway

// The presets of --wan-trunk: how a site pair's streams share the WAN.
// bench/figures/competing holds the measurements that chose them: the
// shared trunk wins where the site's hosts run CUBIC (beside any
// neighbour) and on an idle WAN; a BBR connection per stream, with none
// of the trunk's controls, wins on BBR hosts beside BBR flows.

import (
	"fmt"
	"os"
	"strings"
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
	// TrunkAuto is TrunkParallel on a gateway whose host runs BBR by
	// default (net.ipv4.tcp_congestion_control), TrunkShared elsewhere:
	// the gateway host is taken to run what the site's nodes run.
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

// resolveTrunk is the preset TrunkAuto stands for on this host, and the
// host's congestion control it was chosen by ("" when trunk is not auto).
func resolveTrunk(trunk string) (preset, cc string, err error) {
	if trunk != TrunkAuto {
		return trunk, "", nil
	}
	cc, err = hostCC()
	if err != nil || cc == "" {
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
