package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/mpi5k/mpi5k/sitemap"
)

// A site may list several gateway hosts (the site record, then `gateway`
// records: sitemap.Site.Gateways). Each gateway process is one of them:
// it listens at that entry's lan= and wan=, dials and accepts links as
// that entry, and says which it is in its HELLO (header.ExtGateway).

// whichGateway returns the index in site.Gateways of the gateway this
// process is: the one whose listeners are lan and wan (--lan, --wan; an
// unset one matches any); with neither set, the site's only gateway, or
// the only one whose two addresses belong to this host (local: nil reads
// the host's interfaces).
func whichGateway(m *sitemap.Map, site *sitemap.Site, lan, wan netip.AddrPort, local func() ([]netip.Addr, error)) (int, error) {
	gws := site.Gateways
	if lan.IsValid() || wan.IsValid() {
		for i, g := range gws {
			if (!lan.IsValid() || g.LAN == unmapAP(lan)) && (!wan.IsValid() || g.WAN == unmapAP(wan)) {
				return i, nil
			}
		}
		var given []string
		if lan.IsValid() {
			given = append(given, "--lan "+lan.String())
		}
		if wan.IsValid() {
			given = append(given, "--wan "+wan.String())
		}
		return 0, fmt.Errorf("%s: no gateway of site %s in the site map has these listeners; the map lists:\n%s\ngive the lan= and wan= of one of these lines, or add a line for this gateway",
			strings.Join(given, " "), site.Name, gatewayLines(site))
	}
	if len(gws) == 1 {
		return 0, nil
	}
	if local == nil {
		local = hostAddrs
	}
	addrs, err := local()
	if err != nil {
		return 0, fmt.Errorf("site %s lists %d gateways, and this host's addresses cannot be read to tell which this is (%v): give --lan and --wan", site.Name, len(gws), err)
	}
	mine := map[netip.Addr]bool{}
	for _, a := range addrs {
		mine[a.Unmap()] = true
	}
	found := -1
	for i, g := range gws {
		if mine[g.LAN.Addr()] && mine[g.WAN.Addr()] {
			if found >= 0 {
				return 0, fmt.Errorf("site %s lists %d gateways and the addresses of more than one are this host's:\n%s\nsay which this gateway is with --lan and --wan", site.Name, len(gws), gatewayLines(site))
			}
			found = i
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("site %s lists %d gateways and none has both its lan= and wan= addresses on this host:\n%s\nrun it on one of these hosts, or say which it is with --lan and --wan", site.Name, len(gws), gatewayLines(site))
	}
	return found, nil
}

// gatewayLines are the map's lines of site's gateways, as written.
func gatewayLines(s *sitemap.Site) string {
	var b strings.Builder
	for i, g := range s.Gateways {
		if i == 0 {
			fmt.Fprintf(&b, "  site %s id=%d lan=%s wan=%s", s.Name, s.ID, g.LAN, g.WAN)
		} else {
			fmt.Fprintf(&b, "\n  gateway %s lan=%s wan=%s", s.Name, g.LAN, g.WAN)
		}
	}
	return b.String()
}

// hostAddrs are the addresses of this host's interfaces.
func hostAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if pn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(pn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
