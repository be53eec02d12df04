package wrap

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/mpi5k/mpi5k/sitemap"
)

// SiteRule maps a host name or an address range to a site (--sites FILE).
type SiteRule struct {
	Host   string       // exact host name, or
	Prefix netip.Prefix // a CIDR the host's address falls in
	Site   string
	Where  string // file:line, for messages
}

// ReadSiteRules reads --sites FILE: one "<host-or-CIDR> <site>" per line,
// '#' comments.
func ReadSiteRules(path string) ([]SiteRule, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w (want a readable file of \"<host-or-CIDR> <site>\" lines, docs/cli.md)", err)
	}
	defer f.Close()
	var rules []SiteRule
	seen := map[string]string{} // host or CIDR -> where it was first given
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", path, line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s: want \"<host-or-CIDR> <site>\", got %d fields", where, len(fields))
		}
		r := SiteRule{Site: fields[1], Where: where}
		if strings.Contains(fields[0], "/") {
			p, err := netip.ParsePrefix(fields[0])
			if err != nil {
				return nil, fmt.Errorf("%s: bad CIDR %q: %v", where, fields[0], err)
			}
			r.Prefix = p.Masked()
		} else if a, err := netip.ParseAddr(fields[0]); err == nil {
			r.Prefix = netip.PrefixFrom(a, a.BitLen())
		} else {
			if err := checkHostName(fields[0]); err != nil {
				return nil, fmt.Errorf("%s: %v", where, err)
			}
			r.Host = fields[0]
		}
		key := r.Host
		if key == "" {
			key = r.Prefix.String()
		}
		if first, dup := seen[key]; dup {
			return nil, fmt.Errorf("%s: %s is given twice (first at %s): give each host or range one line, with its one site", where, fields[0], first)
		}
		seen[key] = where
		rules = append(rules, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", path)
	}
	return rules, nil
}

// Resolver finds a host's addresses; tests replace it.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// DefaultResolver uses the system resolver (on the lab, each host's own
// hosts file).
func DefaultResolver(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, nil
}

// LiteralResolver resolves addresses written as such and leaves names
// without address: a dry run asks no DNS (PlanOptions.Unresolved).
func LiteralResolver(_ context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	return nil, nil
}

// SiteHost is a host with its site and addresses (none when a dry run
// left its name unresolved).
type SiteHost struct {
	Host
	Site  string
	Addrs []netip.Addr
}

// addr is the host's first address, or its name when unresolved.
func (h SiteHost) addr() string {
	if len(h.Addrs) == 0 {
		return h.Name
	}
	return h.Addrs[0].String()
}

// hostPort is addr with a port.
func (h SiteHost) hostPort(port int) string { return net.JoinHostPort(h.addr(), strconv.Itoa(port)) }

// Site is one site of the job.
type Site struct {
	Name    string
	ID      uint8
	Hosts   []SiteHost // in host-list order
	Gateway SiteHost
	// More are the site's further gateway hosts (--gateway SITE=H1,H2):
	// `gateway` records of the map, each running a gateway of its own.
	More []SiteHost
	// Ready is where a hand-written map says the site's running gateway
	// answers /ready (ready=; invalid: none runs).
	Ready netip.AddrPort
	// ports are the gateway's LAN and WAN ports a hand-written map gives
	// (zero: the job's, drawn).
	ports ports
}

// gatewayHosts are the site's gateway hosts: Gateway, then More.
func (s *Site) gatewayHosts() []SiteHost { return append([]SiteHost{s.Gateway}, s.More...) }

// isGateway reports whether host name is one of the site's gateway hosts.
func (s *Site) isGateway(name string) bool {
	for _, g := range s.gatewayHosts() {
		if g.Name == name {
			return true
		}
	}
	return false
}

// Plan is what the wrapper decided: sites, hosts, gateways.
type Plan struct {
	Sites []*Site // sorted by name; ids 1..n in that order
}

// PlanOptions are the inputs of site assignment.
type PlanOptions struct {
	Rules       []SiteRule        // --sites FILE; nil = Grid'5000 naming
	Gateways    map[string]string // site -> gateway host, or hosts separated by commas (--gateway): must name a site of the job
	EnvGateways map[string]string // from $MPI5K_GATEWAYS: sites the job does not use are ignored
	Dedicated   bool              // gateways run no ranks
	Resolve     Resolver
	// Unresolved accepts hosts Resolve finds no address for (a dry run
	// with LiteralResolver); only --sites rules by name can place them.
	Unresolved bool
}

// MakePlan assigns every host to a site and picks each site's gateway.
func MakePlan(ctx context.Context, hosts []Host, o PlanOptions) (*Plan, error) {
	if o.Resolve == nil {
		o.Resolve = DefaultResolver
	}
	bySite := map[string]*Site{}
	var order []string
	resolve := func(h Host) (SiteHost, error) {
		addrs, err := o.Resolve(ctx, h.Name)
		if err != nil {
			return SiteHost{}, fmt.Errorf("cannot resolve host %s: %v", h.Name, err)
		}
		if len(addrs) == 0 && !o.Unresolved {
			return SiteHost{}, fmt.Errorf("cannot resolve host %s: no address", h.Name)
		}
		return SiteHost{Host: h, Addrs: addrs}, nil
	}
	for _, h := range hosts {
		sh, err := resolve(h)
		if err != nil {
			return nil, err
		}
		site, err := siteOf(sh, o.Rules)
		if err != nil {
			return nil, err
		}
		sh.Site = site
		s := bySite[site]
		if s == nil {
			s = &Site{Name: site}
			bySite[site] = s
			order = append(order, site)
		}
		s.Hosts = append(s.Hosts, sh)
	}
	gws := map[string]string{}
	for site, gw := range o.EnvGateways {
		if bySite[site] != nil {
			gws[site] = gw
		}
	}
	for site, gw := range o.Gateways {
		if bySite[site] == nil {
			return nil, fmt.Errorf("--gateway %s=%s: no host of the job is in site %s", site, gw, site)
		}
		gws[site] = gw
	}
	for site, gw := range gws {
		s := bySite[site]
		for i, name := range strings.Split(gw, ",") {
			sh, err := resolve(Host{Name: name})
			if err != nil {
				return nil, fmt.Errorf("gateway of site %s: %v", site, err)
			}
			sh.Site = site
			if i == 0 {
				s.Gateway = sh
			} else {
				s.More = append(s.More, sh)
			}
		}
	}
	sort.Strings(order)
	if len(order) > 255 {
		return nil, fmt.Errorf("%d sites; a site map holds at most 255", len(order))
	}
	p := &Plan{}
	for i, name := range order {
		s := bySite[name]
		s.ID = uint8(i + 1)
		if s.Gateway.Name == "" {
			// As the original prototype: the last host of the site's list.
			s.Gateway = s.Hosts[len(s.Hosts)-1]
		}
		if o.Dedicated {
			ranks := 0
			for _, h := range s.Hosts {
				if !s.isGateway(h.Name) {
					ranks++
				}
			}
			if ranks == 0 {
				return nil, fmt.Errorf("site %s: --dedicated-gateways leaves no host for ranks (its only host %s is the gateway)", name, s.Gateway.Name)
			}
		}
		p.Sites = append(p.Sites, s)
	}
	return p, nil
}

func siteOf(h SiteHost, rules []SiteRule) (string, error) {
	if rules == nil {
		if s, ok := sitemap.Grid5000Site(h.Name); ok {
			return s, nil
		}
		return "", fmt.Errorf("host %s is in no site: its name is not <cluster>-<n>.<site>[.<domain>] (give --sites FILE)", h.Name)
	}
	for _, r := range rules {
		if r.Host != "" && r.Host == h.Name {
			return r.Site, nil
		}
	}
	for _, r := range rules {
		if r.Host != "" {
			continue
		}
		for _, a := range h.Addrs {
			if r.Prefix.Contains(a) {
				return r.Site, nil
			}
		}
	}
	if len(h.Addrs) == 0 {
		return "", fmt.Errorf("host %s is in no site of the --sites file by name, and a dry run resolves no names to match its address ranges: name the host in the file to see its plan", h.Name)
	}
	return "", fmt.Errorf("host %s (%s) is in no site of the --sites file", h.Name, h.Addrs[0])
}

// Unresolved reports whether some host has no address (a dry run): the
// map then shows names in place of addresses.
func (p *Plan) Unresolved() bool {
	for _, s := range p.Sites {
		for _, h := range append(s.gatewayHosts(), s.Hosts...) {
			if len(h.Addrs) == 0 {
				return true
			}
		}
	}
	return false
}

// MapText renders the plan as a site map (docs/sitemap-format.md). Each
// gateway listens on its first address: lanPort for its site's shims,
// wanPort for the peer gateways.
func (p *Plan) MapText(lanPort, wanPort int) string {
	var b strings.Builder
	b.WriteString("# mpi5k site map written by mpi5k run\n")
	for _, s := range p.Sites {
		fmt.Fprintf(&b, "site %s id=%d lan=%s wan=%s\n", s.Name, s.ID, s.Gateway.hostPort(lanPort), s.Gateway.hostPort(wanPort))
		for _, g := range s.More {
			fmt.Fprintf(&b, "gateway %s lan=%s wan=%s\n", s.Name, g.hostPort(lanPort), g.hostPort(wanPort))
		}
		seen := map[string]bool{}
		hosts := append(s.gatewayHosts(), s.Hosts...)
		for _, h := range hosts {
			if seen[h.Name] {
				continue
			}
			seen[h.Name] = true
			addrs := make([]string, len(h.Addrs))
			for i, a := range h.Addrs {
				addrs[i] = a.String()
			}
			if len(addrs) == 0 {
				addrs = []string{h.Name}
			}
			fmt.Fprintf(&b, "host %s %s %s\n", s.Name, h.Name, strings.Join(addrs, " "))
		}
	}
	return b.String()
}

// ParseGateways reads "site1=gw.site1,site2=gw.site2" ($MPI5K_GATEWAYS) or
// one --gateway SITE=HOST value into m. A site may have several gateway
// hosts: SITE=H1,H2 (a host without SITE= belongs to the site before it),
// or SITE=H1 and SITE=H2 (repeated); m holds them separated by commas,
// the first the site record's.
func ParseGateways(m map[string]string, s string) error {
	site := ""
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		st, host, ok := strings.Cut(item, "=")
		switch {
		case ok:
			site = st
		case site == "":
			return fmt.Errorf("gateway %q: want SITE=HOST", item)
		default:
			host = item
		}
		if site == "" || host == "" {
			return fmt.Errorf("gateway %q: want SITE=HOST", item)
		}
		if err := checkHostName(host); err != nil {
			return fmt.Errorf("gateway %q: %v", item, err)
		}
		old := m[site]
		switch {
		case old == "":
			m[site] = host
		case slices.Contains(strings.Split(old, ","), host):
		case strings.Count(old, ",")+1 >= sitemap.MaxGateways:
			return fmt.Errorf("site %s: more than %d gateway hosts", site, sitemap.MaxGateways)
		default:
			m[site] = old + "," + host
		}
	}
	return nil
}
