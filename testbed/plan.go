package testbed

import (
	"fmt"
	"net/netip"
	"strings"
)

// Address plan (addresses may repeat between labs: each lab lives in its own
// namespaces). Site k (1-based): LAN 10.77.k.0/24, router .1, gateway j
// (gw.<site>, then gw2.<site> ... with --gateways) .(1+j), node-i .(10+i),
// extra (traffic) host x-j .(200+j). A gateway's WAN leg (--gateway-nics 2)
// is 10.78.k.(1+j)/24 with the router at 10.78.k.1.
const (
	// LANCIDR covers every site LAN; MPI libraries can be told to use it.
	LANCIDR = "10.77.0.0/16"
	// WANCIDR covers every gateway WAN leg.
	WANCIDR = "10.78.0.0/16"
	// GatewayLANPort and GatewayWANPort are the gateway ports written in the
	// site map.
	GatewayLANPort = 5000
	GatewayWANPort = 5001
	// extraHosts is the number of traffic hosts (x-1..) per site used by
	// `lab cross`; never MPI nodes.
	extraHosts = 1
)

type hostKind int

const (
	kindNode hostKind = iota
	kindGateway
	kindExtra
)

// hostPlan is one lab host.
type hostPlan struct {
	Name    string // node-1.site1
	Site    string
	SiteIdx int // 1-based
	Kind    hostKind
	Index   int // node, gateway or extra index, 1-based
	LAN     netip.Addr
	WAN     netip.Addr // valid only for a 2-NIC gateway
	RtrPort string     // router-side veth name of the LAN leg
	RtrWAN  string     // router-side veth name of the WAN leg (2-NIC gateway)
}

func siteLAN(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(k), 0}), 24)
}
func siteWAN(k int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 78, byte(k), 0}), 24)
}
func addr4(a, b, c, d int) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(a), byte(b), byte(c), byte(d)})
}
func routerLAN(k int) netip.Addr { return addr4(10, 77, k, 1) }
func routerWAN(k int) netip.Addr { return addr4(10, 78, k, 1) }

// bridgeName and tunName are interface names inside the router namespace.
func bridgeName(k int) string     { return fmt.Sprintf("br%d", k) }
func tunName(from, to int) string { return fmt.Sprintf("t%d-%d", from, to) }

// tableFor is the policy routing table for packets entering from site k.
func tableFor(k int) int { return 100 + k }

// nsName is the network namespace name of a host (file under /run/netns).
func nsName(lab, host string) string { return lab + "-" + host }

// routerNS is the namespace holding the bridges, TUN devices and routing.
func routerNS(lab string) string { return lab + "-wan" }

// gatewaySuffix tells gateway host j of a site apart: "" for the first,
// then "2", "3"...
func gatewaySuffix(j int) string {
	if j == 1 {
		return ""
	}
	return fmt.Sprint(j)
}

// gatewayName is the name of gateway host j (1-based) of site: gw.<site>,
// gw2.<site>, ...
func gatewayName(site string, j int) string { return "gw" + gatewaySuffix(j) + "." + site }

// gatewayWANName is the name of the WAN leg of gateway host j of site in
// the hosts file: gw-wan.<site>, gw2-wan.<site>, ...
func gatewayWANName(site string, j int) string { return "gw" + gatewaySuffix(j) + "-wan." + site }

// planHosts lists every host of a normalized config: per site the nodes, the
// gateways, then the extra hosts.
func planHosts(c *Config) []hostPlan {
	var hs []hostPlan
	for i, s := range c.Sites {
		k := i + 1
		for n := 1; n <= c.Nodes; n++ {
			hs = append(hs, hostPlan{Name: fmt.Sprintf("node-%d.%s", n, s), Site: s, SiteIdx: k, Kind: kindNode,
				Index: n, LAN: addr4(10, 77, k, 10+n), RtrPort: fmt.Sprintf("v%dn%d", k, n)})
		}
		for j := 1; j <= c.GatewaysPerSite(); j++ {
			g := hostPlan{Name: gatewayName(s, j), Site: s, SiteIdx: k, Kind: kindGateway, Index: j,
				LAN: addr4(10, 77, k, 1+j), RtrPort: fmt.Sprintf("v%dg%s", k, gatewaySuffix(j))}
			if c.GatewayNICs == 2 {
				g.WAN = addr4(10, 78, k, 1+j)
				g.RtrWAN = fmt.Sprintf("w%dg%s", k, gatewaySuffix(j))
			}
			hs = append(hs, g)
		}
		for x := 1; x <= extraHosts; x++ {
			hs = append(hs, hostPlan{Name: fmt.Sprintf("x-%d.%s", x, s), Site: s, SiteIdx: k, Kind: kindExtra,
				Index: x, LAN: addr4(10, 77, k, 200+x), RtrPort: fmt.Sprintf("v%dx%d", k, x)})
		}
	}
	return hs
}

// hostsFile renders the lab's /etc/hosts (bind-mounted over /etc/hosts for
// every command run in a lab host).
func hostsFile(c *Config, hs []hostPlan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# mpi5k lab %s: written by `mpi5k lab up`, removed by `mpi5k lab down`\n", c.Name)
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, h := range hs {
		// Only full names: short names (node-1) repeat across sites.
		fmt.Fprintf(&b, "%s\t%s\n", h.LAN, h.Name)
		if h.WAN.IsValid() {
			fmt.Fprintf(&b, "%s\t%s\n", h.WAN, gatewayWANName(h.Site, h.Index))
		}
	}
	return b.String()
}

// siteMap renders the site map (sitemap text format): one `site` per site
// (its first gateway host) with a `gateway` record per further gateway
// host, one `net` per site LAN, one `host` per lab host.
func siteMap(c *Config, hs []hostPlan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# mpi5k site map of lab %s (written by `mpi5k lab up`)\n", c.Name)
	fmt.Fprintf(&b, "# rtt=%v wan-rate=%d bit/s loss=%g gateway-nics=%d gateways=%d\n", c.RTT, c.WANRate, c.Loss, c.GatewayNICs, c.GatewaysPerSite())
	for i, s := range c.Sites {
		k := i + 1
		for j := 1; j <= c.GatewaysPerSite(); j++ {
			lan := addr4(10, 77, k, 1+j)
			wan := lan
			if c.GatewayNICs == 2 {
				wan = addr4(10, 78, k, 1+j)
			}
			lanAP, wanAP := netip.AddrPortFrom(lan, GatewayLANPort), netip.AddrPortFrom(wan, GatewayWANPort)
			if j == 1 {
				fmt.Fprintf(&b, "site %s id=%d lan=%s wan=%s\n", s, k, lanAP, wanAP)
			} else {
				fmt.Fprintf(&b, "gateway %s lan=%s wan=%s\n", s, lanAP, wanAP)
			}
		}
	}
	for i, s := range c.Sites {
		fmt.Fprintf(&b, "net %s %s\n", s, siteLAN(i+1))
	}
	for _, h := range hs {
		if h.WAN.IsValid() {
			fmt.Fprintf(&b, "host %s %s %s %s\n", h.Site, h.Name, h.LAN, h.WAN)
		} else {
			fmt.Fprintf(&b, "host %s %s %s\n", h.Site, h.Name, h.LAN)
		}
	}
	return b.String()
}

// gatewaysEnv is the MPI5K_GATEWAYS value: site1=gw.site1,site2=gw.site2,
// and with n gateway hosts per site site1=gw.site1,gw2.site1,... (the form
// mpi5k run's --gateway takes: a host without SITE= is the site's before).
func gatewaysEnv(sites []string, n int) string {
	parts := make([]string, len(sites))
	for i, s := range sites {
		hosts := make([]string, max(n, 1))
		for j := range hosts {
			hosts[j] = gatewayName(s, j+1)
		}
		parts[i] = s + "=" + strings.Join(hosts, ",")
	}
	return strings.Join(parts, ",")
}
