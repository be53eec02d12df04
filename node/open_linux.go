package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/mx/afpacket"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Open starts the node's MX engine on the LAN interface lanIf and fills
// cfg's Addr (the interface's address in a site of m; site, if not empty,
// must be that site), Gateways and EP. Each gateway's MAC comes from the
// neighbour table; a datagram to each gateway makes the kernel resolve it
// when it is missing, and puts this node in the gateway host's table,
// where the gateway looks up whom to admit and where a node is. A
// gateway whose MAC does not resolve is left out, with a log line, while
// another one does. close stops the engine.
func Open(cfg *Config, lanIf string, m *sitemap.Map, site string) (close func(), err error) {
	ifi, err := net.InterfaceByName(lanIf)
	if err != nil {
		return nil, fmt.Errorf("--lan-if %q: %w", lanIf, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("--lan-if %q: %w", lanIf, err)
	}
	var s *sitemap.Site
	for _, a := range addrs {
		pn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(pn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ls, ok := m.Lookup(ip); ok && (site == "" || ls.Name == site) {
			cfg.Addr, s = ip, ls
			break
		}
	}
	if s == nil {
		if site != "" {
			return nil, fmt.Errorf("--lan-if %q has no address in site %s of the map", lanIf, site)
		}
		return nil, fmt.Errorf("--lan-if %q has no address in a site of the map", lanIf)
	}
	if cfg.Gateways, err = resolveGateways(s, func(gw netip.AddrPort) (mx.MAC, error) { return gatewayMAC(ifi, gw) }, cfg.Log); err != nil {
		return nil, err
	}
	allowed := map[mx.MAC]bool{}
	for _, g := range cfg.Gateways {
		allowed[g.MX.MAC] = true
	}
	link, err := afpacket.Open(lanIf)
	if err != nil {
		return nil, err
	}
	// Only the site's gateways open streams to a node, and only they
	// answer the node's: frames from any other MAC are dropped and
	// counted before they are decoded. allowed is read-only from here.
	e, err := mx.New(link, mxlan.Config(func(m mx.MAC) bool { return allowed[m] }))
	if err != nil {
		link.Close()
		return nil, err
	}
	ep, err := e.Open(mxlan.Endpoint)
	if err != nil {
		e.Close()
		return nil, err
	}
	cfg.EP = ep
	return func() { e.Close() }, nil
}

// resolveGateways finds the MAC of each gateway of site s with mac, all
// at once, so that a gateway host that is down costs its wait once. A
// gateway whose MAC does not resolve is left out, with a warning naming
// it, while another one resolves; when none does, the error says why
// each did not.
func resolveGateways(s *sitemap.Site, mac func(netip.AddrPort) (mx.MAC, error), log *slog.Logger) ([]Gateway, error) {
	gws := s.Gateways // the site record's first (sitemap fills it)
	macs := make([]mx.MAC, len(gws))
	errs := make([]error, len(gws))
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); macs[i], errs[i] = mac(g.LAN) }()
	}
	wg.Wait()
	var out []Gateway
	for i, g := range gws {
		if errs[i] != nil {
			if len(gws) > 1 && log != nil {
				log.Warn("gateway left out: its MAC address does not resolve; the site's other gateways carry the node's streams",
					"site", s.Name, "gateway", g.LAN.String(), "err", errs[i])
			}
			continue
		}
		out = append(out, Gateway{LAN: g.LAN, MX: mx.Addr{MAC: macs[i], EP: mxlan.Endpoint}})
	}
	switch {
	case len(out) > 0:
		return out, nil
	case len(gws) == 1:
		return nil, errs[0]
	}
	return nil, fmt.Errorf("none of site %s's %d gateways resolves: %w", s.Name, len(gws), errors.Join(errs...))
}

// gatewayMAC finds gw's MAC in the neighbour table of ifi, prompting the
// kernel to resolve it for up to 3 s. The first prompt goes out even when
// the MAC is known, so that the gateway host, which answers it, has this
// node in its table too.
func gatewayMAC(ifi *net.Interface, gw netip.AddrPort) (mx.MAC, error) {
	deadline := time.Now().Add(3 * time.Second)
	prompted := time.Now()
	if err := prompt(gw); err != nil {
		return mx.MAC{}, fmt.Errorf("gateway %v: %w", gw.Addr(), err)
	}
	for {
		list, err := netlink.NeighList(ifi.Index, netlink.FAMILY_ALL)
		if err != nil {
			return mx.MAC{}, fmt.Errorf("neighbour table of %s: %w", ifi.Name, err)
		}
		for _, n := range list {
			a, ok := netip.AddrFromSlice(n.IP)
			if ok && a.Unmap() == gw.Addr() && len(n.HardwareAddr) == 6 &&
				n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
				var m mx.MAC
				copy(m[:], n.HardwareAddr)
				return m, nil
			}
		}
		if time.Now().After(deadline) {
			return mx.MAC{}, fmt.Errorf("gateway %v: no MAC address in the neighbour table of %s after 3 s (is the gateway host up, on this LAN?)", gw.Addr(), ifi.Name)
		}
		if time.Since(prompted) > time.Second {
			prompted = time.Now()
			if err := prompt(gw); err != nil {
				return mx.MAC{}, fmt.Errorf("gateway %v: %w", gw.Addr(), err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// prompt sends one empty datagram to the gateway's discard port: the
// kernel resolves the address first.
func prompt(gw netip.AddrPort) error {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(gw.Addr(), 9)))
	if err != nil {
		return err
	}
	defer c.Close()
	c.Write([]byte{0}) // a refusal (ICMP) still resolved the address
	return nil
}
