package testbed

import (
	"fmt"
	"strings"
)

// lanTable is the nftables table (bridge family, router namespace) that
// drops frames on the sites' LANs (Config.LANLoss).
const lanTable = "mpi5k_lan"

// lanLossScale is numgen's modulus: loss is applied in steps of 1e-6.
const lanLossScale = 1_000_000

// lanLossScript is the nft script for c's LAN loss, "" when no site loses.
// A frame is charged once per crossing of its site's bridge: where it
// enters from a host's port (prerouting) or where the router sends it to
// one (output); frames the bridge forwards from port to port were charged
// where they entered. Every site with loss counts its frames and drops in
// the named counters lan<k>_frames and lan<k>_drops.
func lanLossScript(c *Config, hosts []hostPlan) string {
	var counters, enter, leave strings.Builder
	for i, site := range c.Sites {
		f := c.SiteLANLossOf(site)
		if f == 0 {
			continue
		}
		k := i + 1
		var ports []string
		for _, h := range hosts {
			if h.SiteIdx == k {
				ports = append(ports, `"`+h.RtrPort+`"`)
			}
		}
		set := "{ " + strings.Join(ports, ", ") + " }"
		n := uint64(f*lanLossScale + 0.5)
		fmt.Fprintf(&counters, "\tcounter lan%d_frames {}\n\tcounter lan%d_drops {}\n", k, k)
		rule := fmt.Sprintf("counter name \"lan%d_frames\" numgen random mod %d < %d counter name \"lan%d_drops\" drop", k, lanLossScale, n, k)
		fmt.Fprintf(&enter, "\t\tiifname %s %s\n", set, rule)
		fmt.Fprintf(&leave, "\t\toifname %s %s\n", set, rule)
	}
	if counters.Len() == 0 {
		return ""
	}
	return "table bridge " + lanTable + " {\n" + counters.String() +
		"\tchain enter {\n\t\ttype filter hook prerouting priority -10; policy accept;\n" + enter.String() + "\t}\n" +
		"\tchain leave {\n\t\ttype filter hook output priority -10; policy accept;\n" + leave.String() + "\t}\n}\n"
}

// LANStats counts one site's LAN frames and the frames its --lan-loss
// dropped (sites without LAN loss are not counted).
type LANStats struct {
	Site   string  `json:"site"`
	Loss   float64 `json:"loss"`
	Frames uint64  `json:"frames"`
	Drops  uint64  `json:"drops"`
}
