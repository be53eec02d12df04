package wrap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/mpi5k/mpi5k/sitemap"
)

// A site map written by hand (--map FILE, docs/sitemap-format.md) is the
// map of a site that runs gateways as a service, or of hosts whose names
// say nothing of their site: it gives each site's gateway listeners
// (lan= and wan= may be different addresses) and its nets and hosts. The
// run uses a site's running gateway when the map names its ready=
// listener and /ready answers there; for the other sites it starts a
// per-job gateway on the map's listeners, on the host whose address they
// are.

// mapSites assigns every host to a site of m: by host record, else by the
// addresses it resolves to. Sites come back in id order.
func mapSites(ctx context.Context, m *sitemap.Map, path string, hosts []Host, resolve Resolver, dry bool) ([]*sitemap.Site, map[string][]Host, error) {
	bySite := map[string][]Host{}
	for _, h := range hosts {
		if mh, ok := m.Host(h.Name); ok {
			bySite[mh.Site] = append(bySite[mh.Site], h)
			continue
		}
		addrs, err := resolve(ctx, h.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot resolve host %s: %v", h.Name, err)
		}
		site := ""
		for _, a := range addrs {
			if s, ok := m.Lookup(a); ok {
				site = s.Name
				break
			}
		}
		switch {
		case site != "":
			bySite[site] = append(bySite[site], h)
		case len(addrs) == 0 && dry:
			return nil, nil, fmt.Errorf("host %s is in no host record of --map %s, and a dry run resolves no names to match its nets: add `host <site> %s <addr>` to see its plan", h.Name, path, h.Name)
		case len(addrs) == 0:
			return nil, nil, fmt.Errorf("cannot resolve host %s: no address", h.Name)
		default:
			return nil, nil, fmt.Errorf("host %s (%s) is in no site of --map %s: add a `net <site> <cidr>` covering it or a `host <site> %s %s` record (docs/sitemap-format.md)",
				h.Name, addrs[0], path, h.Name, addrs[0])
		}
	}
	var sites []*sitemap.Site
	for _, s := range m.Sites() {
		if len(bySite[s.Name]) > 0 {
			sites = append(sites, s)
		}
	}
	return sites, bySite, nil
}

// gatewayHost is where a site's per-job gateway runs: the host record that
// holds its lan= address, else that address itself.
func gatewayHost(s *sitemap.Site) string {
	for _, h := range s.Hosts {
		for _, a := range h.Addrs {
			if a == s.LAN.Addr() {
				return h.Name
			}
		}
	}
	return s.LAN.Addr().String()
}

// placeByMap places the hosts by the map of --map: by host record, else
// by net. Each site's gateway is the map's: its running one (ready=) or
// one the job starts on the map's listeners.
func (c *Config) placeByMap(ctx context.Context, hosts []Host) (*placement, error) {
	if c.SitesFile != "" {
		return nil, errors.New("--map and --sites both say which site a host is in: give one (--map holds the same as --sites, and the gateways)")
	}
	if c.Dedicated || len(c.Gateways) > 0 {
		return nil, errors.New("--map places each site's gateway at its lan= address: leave out --dedicated-gateways and --gateway")
	}
	m, err := sitemap.Load(c.MapFile)
	if err != nil {
		return nil, fmt.Errorf("--map: %v", err)
	}
	resolve := c.Resolve
	if resolve == nil {
		resolve = DefaultResolver
	}
	if c.DryRun {
		resolve = LiteralResolver
	}
	mss, bySite, err := mapSites(ctx, m, c.MapFile, hosts, resolve, c.DryRun)
	if err != nil {
		return nil, err
	}
	var sites []*Site
	for _, s := range mss {
		ws := &Site{Name: s.Name, ID: s.ID, Gateway: SiteHost{Host: Host{Name: gatewayHost(s)}, Site: s.Name, Addrs: []netip.Addr{s.LAN.Addr()}},
			Ready: s.Ready, ports: ports{lan: int(s.LAN.Port()), wan: int(s.WAN.Port())}}
		for _, h := range bySite[s.Name] {
			ws.Hosts = append(ws.Hosts, SiteHost{Host: h, Site: s.Name})
		}
		sites = append(sites, ws)
	}
	header := "# mpi5k site map: the job's sites of " + c.MapFile + "\n"
	return &placement{
		sites: sites,
		siteMap: func(_, _ int, services map[string]bool) (string, error) {
			jm, err := jobMap(m, mss, services)
			if err != nil {
				return "", fmt.Errorf("--map %s: %v", c.MapFile, err)
			}
			return header + jm.String(), nil
		},
		mapHosts: func(own []*Site) []string { return ownMapHosts(hosts, own) },
		// Keys: the job's own gateways get fresh ones when it runs no
		// other; a keyed map's sites need their service gateways, whose
		// private keys mpi5k run does not hold.
		keyed:    m.HasKeys(),
		mapPorts: true,
		// nodeDaemons stays false: a hand-written map's job runs no node
		// daemons, even with --lan-transport mx.
	}, nil
}

// ownMapHosts are the job's hosts and the gateway hosts of own, sorted.
func ownMapHosts(hosts []Host, own []*Site) []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range hosts {
		if !seen[h.Name] {
			seen[h.Name] = true
			out = append(out, h.Name)
		}
	}
	for _, s := range own {
		if !seen[s.Gateway.Name] {
			seen[s.Gateway.Name] = true
			out = append(out, s.Gateway.Name)
		}
	}
	sort.Strings(out)
	return out
}

func siteNames(sites []*Site) string {
	var names []string
	for _, s := range sites {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", site ")
}

func sitesOf(gws []*gateway) []*Site {
	var sites []*Site
	for _, g := range gws {
		sites = append(sites, g.site)
	}
	return sites
}

func metricsURLs(gws []*gateway) string {
	var us []string
	for _, g := range gws {
		us = append(us, "http://"+g.metrics+"/metrics")
	}
	return strings.Join(us, " ")
}

// jobMap is m with the job's sites only: a per-job gateway is ready once
// its links to every site of its map are up, and a site the job does not
// use may run no gateway at all. A site's further gateway hosts (gateway
// records) stay only for services, the sites whose gateways run already:
// the job's ranks then spread over them, and learn their addresses as
// gateways'. For the others the job starts one gateway, the site
// record's, which the job's own gateways alone must be able to reach.
func jobMap(m *sitemap.Map, sites []*sitemap.Site, services map[string]bool) (*sitemap.Map, error) {
	b := sitemap.NewBuilder()
	for _, s := range sites {
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
		if services[s.Name] {
			for _, g := range s.Gateways[1:] {
				b.AddGateway(s.Name, g.LAN, g.WAN)
			}
		}
		for _, n := range s.Nets {
			b.AddNet(s.Name, n)
		}
		for _, h := range s.Hosts {
			b.AddHost(s.Name, h.Name, h.Addrs...)
		}
	}
	return b.Build()
}
