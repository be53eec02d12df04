package testbed

import (
	"fmt"
	"strings"
	"time"
)

// lanTable is the nftables table (bridge family, router namespace) that
// drops frames on the sites' LANs (Config.LANLoss).
const lanTable = "mpi5k_lan"

// lanLossScale is numgen's modulus: loss is applied in steps of 1e-6.
const lanLossScale = 1_000_000

// lanQueueTable is the nftables table (netdev family, router namespace)
// that diverts the packets a site's LAN reorders to the emulator.
const lanQueueTable = "mpi5k_lanq"

// lanTUN names the TUN device, in the router namespace, through which the
// emulator holds back site k's reordered LAN packets.
func lanTUN(k int) string { return fmt.Sprintf("l%d", k) }

// lanLossScript is the nft script for c's LAN loss and reordering, "" when
// no site has either.
//
// Loss: a frame is charged once per crossing of its site's bridge, where it
// enters from a host's port (prerouting) or where the router sends it to
// one (output); frames the bridge forwards from port to port were charged
// where they entered. Counters lan<k>_frames and lan<k>_drops.
//
// Reordering: at the ingress of the site's ports (before the bridge) a
// fraction of the IPv4 packets is forwarded to the TUN lanTUN(k), whose
// reader in the emulator holds each back LANReorderDelay and writes it
// back; the router then routes it to its destination (in the site, or over
// the WAN: a policy rule gives the TUN the site's table). Those packets
// are routed instead of bridged (TTL - 1, the router's MAC as source), and
// later packets of their flow overtake them. Counter lan<k>_held.
func lanLossScript(c *Config, hosts []hostPlan) string {
	var counters, enter, leave, queue strings.Builder
	for i, site := range c.Sites {
		k := i + 1
		var ports []string
		for _, h := range hosts {
			if h.SiteIdx == k {
				ports = append(ports, `"`+h.RtrPort+`"`)
			}
		}
		set := "{ " + strings.Join(ports, ", ") + " }"
		if f := c.SiteLANLossOf(site); f > 0 {
			n := uint64(f*lanLossScale + 0.5)
			fmt.Fprintf(&counters, "\tcounter lan%d_frames {}\n\tcounter lan%d_drops {}\n", k, k)
			rule := fmt.Sprintf("counter name \"lan%d_frames\" numgen random mod %d < %d counter name \"lan%d_drops\" drop", k, lanLossScale, n, k)
			fmt.Fprintf(&enter, "\t\tiifname %s %s\n", set, rule)
			fmt.Fprintf(&leave, "\t\toifname %s %s\n", set, rule)
		}
		if f := c.SiteLANReorderOf(site); f > 0 {
			n := uint64(f*lanLossScale + 0.5)
			fmt.Fprintf(&queue, "\tcounter lan%d_held {}\n\tchain hold%d {\n\t\ttype filter hook ingress devices = %s priority -10; policy accept;\n"+
				"\t\tmeta protocol ip numgen random mod %d < %d counter name \"lan%d_held\" fwd to \"%s\"\n\t}\n",
				k, k, set, lanLossScale, n, k, lanTUN(k))
		}
	}
	var out string
	if counters.Len() > 0 {
		out += "table bridge " + lanTable + " {\n" + counters.String() +
			"\tchain enter {\n\t\ttype filter hook prerouting priority -10; policy accept;\n" + enter.String() + "\t}\n" +
			"\tchain leave {\n\t\ttype filter hook output priority -10; policy accept;\n" + leave.String() + "\t}\n}\n"
	}
	if queue.Len() > 0 {
		out += "table netdev " + lanQueueTable + " {\n" + queue.String() + "}\n"
	}
	return out
}

// LANStats counts one site's LAN frames, the frames its --lan-loss dropped
// and the packets its --lan-reorder held back (sites with neither are not
// counted).
type LANStats struct {
	Site   string  `json:"site"`
	Loss   float64 `json:"loss"`
	Frames uint64  `json:"frames"` // counted where loss applies (0 without loss)
	Drops  uint64  `json:"drops"`
	// Reorder is the fraction held back ReorderDelay; Held counts them.
	Reorder      float64       `json:"reorder,omitempty"`
	ReorderDelay time.Duration `json:"reorder_delay_ns,omitempty"`
	Held         uint64        `json:"held,omitempty"`
}
