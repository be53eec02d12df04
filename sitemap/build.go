package sitemap

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Error is one problem of a site map: where (file:line, or "builder:N" for
// the N-th Builder call) and why.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// maxErrors bounds the report: past it, more errors only bury the first.
const maxErrors = 50

func joinErrors(errs []*Error) error {
	slices.SortStableFunc(errs, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
	out := make([]error, 0, min(len(errs), maxErrors)+1)
	for i, e := range errs {
		if i == maxErrors {
			out = append(out, fmt.Errorf("%s: %d more errors", e.File, len(errs)-maxErrors))
			break
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

type pos struct {
	file string
	line int
}

func (p pos) String() string { return fmt.Sprintf("%s:%d", p.file, p.line) }

type siteRec struct {
	at       pos
	name     string
	id       int // 0 = missing
	lan, wan netip.AddrPort
	ready    netip.AddrPort // optional
	nat      bool           // nat=yes
}

type gatewayRec struct {
	at       pos
	site     string
	lan, wan netip.AddrPort
}

type netRec struct {
	at     pos
	site   string
	prefix netip.Prefix
}

type hostRec struct {
	at    pos
	site  string
	name  string
	addrs []netip.Addr
}

type records struct {
	sites    []siteRec
	gateways []gatewayRec
	keys     []keyRec
	nets     []netRec
	hosts    []hostRec
}

// Builder assembles a Map in code (the mpirun wrapper, tests). Add* only
// record; Build applies exactly the validation Parse applies and reports
// problems as "builder:N: reason", N counting Add* calls from 1.
type Builder struct {
	recs records
	n    int
}

// NewBuilder returns an empty Builder.
func NewBuilder() *Builder { return &Builder{} }

func (b *Builder) next() pos {
	b.n++
	return pos{"builder", b.n}
}

// AddSite adds a site with its gateway's LAN and WAN listeners.
func (b *Builder) AddSite(name string, id uint8, lan, wan netip.AddrPort) *Builder {
	b.recs.sites = append(b.recs.sites, siteRec{at: b.next(), name: name, id: int(id), lan: lan, wan: wan})
	if id == 0 {
		b.recs.sites[len(b.recs.sites)-1].id = -1 // present but out of range, not missing
	}
	return b
}

// AddGateway adds another gateway host to site, after the one AddSite
// gave it.
func (b *Builder) AddGateway(site string, lan, wan netip.AddrPort) *Builder {
	b.recs.gateways = append(b.recs.gateways, gatewayRec{at: b.next(), site: site, lan: lan, wan: wan})
	return b
}

// BehindNAT marks the site added last as behind NAT (nat=yes).
func (b *Builder) BehindNAT() *Builder {
	if n := len(b.recs.sites); n > 0 {
		b.recs.sites[n-1].nat = true
	}
	return b
}

// AddNet puts every address of p in site.
func (b *Builder) AddNet(site string, p netip.Prefix) *Builder {
	b.recs.nets = append(b.recs.nets, netRec{at: b.next(), site: site, prefix: p})
	return b
}

// AddHost adds an explicit host of site with one or more addresses.
func (b *Builder) AddHost(site, name string, addrs ...netip.Addr) *Builder {
	b.recs.hosts = append(b.recs.hosts, hostRec{at: b.next(), site: site, name: name, addrs: slices.Clone(addrs)})
	return b
}

// Build validates what was added and returns the Map. The Builder may be
// used again afterwards; the Map does not share memory with it.
func (b *Builder) Build() (*Map, error) {
	m, errs := b.recs.build(nil)
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	return m, nil
}

// span is one piece of address space claimed by a site: a net, or one
// address of a host (as a full-length prefix).
type span struct {
	p    netip.Prefix
	site *Site
	what string
	at   pos
	seq  int
}

// build validates the records (every rule of the format that does not
// concern the text syntax) and constructs the Map. knownBroken names sites
// whose record had a syntax error: references to them are not reported a
// second time as unknown sites.
func (r *records) build(knownBroken map[string]bool) (*Map, []*Error) {
	b := &mapBuild{
		m: &Map{
			byName: map[string]*Site{},
			hosts:  map[string]*Host{},
			gw:     map[netip.Addr]*Site{},
		},
		knownBroken:  knownBroken,
		siteAt:       map[string]pos{},
		idAt:         map[int]*siteRec{},
		listeners:    map[netip.AddrPort]listener{},
		gwAt:         map[*Site][]pos{},
		placeholders: map[string]*Site{},
	}
	b.addSites(r.sites)
	b.addGateways(r.gateways)
	slices.SortFunc(b.m.sites, func(x, y *Site) int { return cmp.Compare(x.ID, y.ID) })
	b.addNets(r.nets)
	b.addHosts(r.hosts)
	b.checkOverlaps()
	r.buildKeys(b.m, b.knownBroken, b.fail)
	r.checkNAT(b.m, b.fail)
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	b.index()
	b.checkGatewayAddrs()
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	return b.m, nil
}

// mapBuild is the state of one build: the Map so far, the errors, and
// what the records claimed.
type mapBuild struct {
	m    *Map
	errs []*Error
	// knownBroken: sites whose records failed; references to them are
	// not reported again as unknown.
	knownBroken  map[string]bool
	siteAt       map[string]pos
	idAt         map[int]*siteRec
	listeners    map[netip.AddrPort]listener
	gwAt         map[*Site][]pos  // the gateway records of each site's extra gateways
	placeholders map[string]*Site // broken sites, for the overlap checks
	spans        []span
}

// listener is a gateway address claimed by a site's record.
type listener struct {
	site, kind string
	at         pos
}

func (b *mapBuild) fail(at pos, format string, args ...any) {
	b.errs = append(b.errs, &Error{File: at.file, Line: at.line, Msg: fmt.Sprintf(format, args...)})
}

// broken marks site as known but failed.
func (b *mapBuild) broken(site string) {
	if b.knownBroken == nil {
		b.knownBroken = map[string]bool{}
	}
	b.knownBroken[site] = true
}

// claim checks one gateway's two listeners (the n-th of its site) and
// claims them; who starts the messages ("site X", "gateway X").
func (b *mapBuild) claim(at pos, who, site, missing string, lan, wan netip.AddrPort, n int) bool {
	ok := true
	for _, l := range []struct {
		kind string
		ap   netip.AddrPort
	}{{"lan", lan}, {"wan", wan}} {
		if !l.ap.IsValid() {
			b.fail(at, "%s%s=", missing, l.kind)
			ok = false
			continue
		}
		if msg := checkListener(l.ap); msg != "" {
			b.fail(at, "%s: %s %s: %s", who, l.kind, l.ap, msg)
			ok = false
			continue
		}
		if o, dup := b.listeners[l.ap]; dup {
			if o.at == at {
				b.fail(at, "%s: lan and wan are the same listener %s", who, l.ap)
			} else {
				b.fail(at, "%s: %s %s is already the %s of site %s (%s)", who, l.kind, l.ap, o.kind, o.site, o.at)
			}
			ok = false
			continue
		}
		kind := l.kind
		if n > 1 {
			kind = fmt.Sprintf("%s of gateway %d", l.kind, n)
		}
		b.listeners[l.ap] = listener{site, kind, at}
	}
	return ok
}

// addSites checks the site records (name, id, first gateway) and adds
// the sites.
func (b *mapBuild) addSites(sites []siteRec) {
	for i := range sites {
		rec := &sites[i]
		if err := checkSiteName(rec.name); err != nil {
			b.fail(rec.at, "%v", err)
			b.broken(rec.name)
			continue
		}
		if first, dup := b.siteAt[rec.name]; dup {
			b.fail(rec.at, "duplicate site %s (first at %s)", rec.name, first)
			continue
		}
		b.siteAt[rec.name] = rec.at
		ok := true
		switch {
		case rec.id == 0:
			b.fail(rec.at, "site %s: missing id=", rec.name)
			ok = false
		case rec.id < 1 || rec.id > 255:
			b.fail(rec.at, "site %s: id %d out of range 1-255", rec.name, max(rec.id, 0))
			ok = false
		case b.idAt[rec.id] != nil:
			o := b.idAt[rec.id]
			b.fail(rec.at, "site %s: id %d already used by site %s (%s)", rec.name, rec.id, o.name, o.at)
			ok = false
		default:
			b.idAt[rec.id] = rec
		}
		if !b.claim(rec.at, "site "+rec.name, rec.name, "site "+rec.name+" has no gateway: missing ", rec.lan, rec.wan, 1) {
			ok = false
		}
		if !ok {
			// Keep the name known so its nets and hosts are still checked
			// without a cascade of "unknown site" errors.
			b.broken(rec.name)
			continue
		}
		if rec.ready.IsValid() && (rec.ready.Port() == 0 || rec.ready.Addr().IsUnspecified()) {
			b.fail(rec.at, "site %s: ready address %s: want the service gateway's --metrics address, with a port and not unspecified", rec.name, rec.ready)
		}
		s := &Site{Name: rec.name, ID: uint8(rec.id), LAN: rec.lan, WAN: rec.wan, Ready: rec.ready, NAT: rec.nat,
			Gateways: []Gateway{{rec.lan, rec.wan}}}
		b.m.byName[s.Name] = s
		b.m.byID[s.ID] = s
		b.m.sites = append(b.m.sites, s)
	}
}

// addGateways adds each site's further gateway hosts.
func (b *mapBuild) addGateways(gateways []gatewayRec) {
	for _, rec := range gateways {
		s := b.m.byName[rec.site]
		if s == nil {
			if !b.knownBroken[rec.site] {
				b.fail(rec.at, "gateway: unknown site %q", rec.site)
			}
			continue
		}
		n := len(s.Gateways) + 1
		if n > MaxGateways {
			b.fail(rec.at, "gateway %s: more than %d gateways for one site", rec.site, MaxGateways)
			continue
		}
		if b.claim(rec.at, "gateway "+rec.site, rec.site, "gateway "+rec.site+": missing ", rec.lan, rec.wan, n) {
			s.Gateways = append(s.Gateways, Gateway{rec.lan, rec.wan})
			b.gwAt[s] = append(b.gwAt[s], rec.at)
		}
	}
}

// site resolves a record's site, reporting an unknown one; broken sites
// get a placeholder so overlap checks still run.
func (b *mapBuild) site(at pos, kind, what, name string) *Site {
	if s := b.m.byName[name]; s != nil {
		return s
	}
	if b.knownBroken[name] {
		if b.placeholders[name] == nil {
			b.placeholders[name] = &Site{Name: name}
		}
		return b.placeholders[name]
	}
	b.fail(at, "%s %s: unknown site %q", kind, what, name)
	return nil
}

// addNets checks the net records and gives each site its prefixes.
func (b *mapBuild) addNets(nets []netRec) {
	type siteNet struct {
		site string
		p    netip.Prefix
	}
	netAt := map[siteNet]pos{}
	for _, rec := range nets {
		p := rec.prefix
		if !p.IsValid() {
			b.fail(rec.at, "net %s: invalid prefix", rec.site)
			continue
		}
		s := b.site(rec.at, "net", p.String(), rec.site)
		if s == nil {
			continue
		}
		switch {
		case p.Addr().Is4In6():
			b.fail(rec.at, "net %s: %s is IPv4-mapped; write it as an IPv4 CIDR", rec.site, p)
			continue
		case p.Masked() != p:
			b.fail(rec.at, "net %s: %s is not canonical (host bits set); write %s", rec.site, p, p.Masked())
			continue
		}
		if first, dup := netAt[siteNet{rec.site, p}]; dup {
			b.fail(rec.at, "net %s: duplicate %s (first at %s)", rec.site, p, first)
			continue
		}
		netAt[siteNet{rec.site, p}] = rec.at
		b.spans = append(b.spans, span{p: p, site: s, what: "net " + p.String(), at: rec.at})
		s.Nets = append(s.Nets, p)
	}
}

// addHosts checks the host records and gives each site its hosts.
func (b *mapBuild) addHosts(hosts []hostRec) {
	hostAt := map[string]pos{}
	for i := range hosts {
		rec := &hosts[i]
		if err := checkHostName(rec.name); err != nil {
			b.fail(rec.at, "host %s: %v", rec.site, err)
			continue
		}
		s := b.site(rec.at, "host", rec.name, rec.site)
		if s == nil {
			continue
		}
		key := strings.ToLower(rec.name)
		if first, dup := hostAt[key]; dup {
			b.fail(rec.at, "duplicate host %s (first at %s)", rec.name, first)
			continue
		}
		hostAt[key] = rec.at
		if len(rec.addrs) == 0 {
			b.fail(rec.at, "host %s: no address", rec.name)
			continue
		}
		if !b.checkHostAddrs(rec) {
			continue
		}
		for _, a := range rec.addrs {
			b.spans = append(b.spans, span{p: netip.PrefixFrom(a, a.BitLen()), site: s,
				what: "host " + rec.name + " address " + a.String(), at: rec.at})
		}
		s.Hosts = append(s.Hosts, Host{Name: rec.name, Site: s.Name, Addrs: slices.Clone(rec.addrs)})
	}
}

// checkHostAddrs reports each bad or repeated address of a host record.
func (b *mapBuild) checkHostAddrs(rec *hostRec) bool {
	ok := true
	seen := map[netip.Addr]bool{}
	for _, a := range rec.addrs {
		if msg := checkAddr(a); msg != "" {
			b.fail(rec.at, "host %s: address %s: %s", rec.name, a, msg)
			ok = false
			continue
		}
		if seen[a] {
			b.fail(rec.at, "host %s: address %s listed twice", rec.name, a)
			ok = false
			continue
		}
		seen[a] = true
	}
	return ok
}

// checkOverlaps reports address space claimed by two sites. Prefixes are
// either nested or disjoint, so after sorting by start address (then
// shorter first), a stack of enclosing prefixes finds every prefix's
// nearest container. The spans stay sorted, for buildRanges.
func (b *mapBuild) checkOverlaps() {
	spans := b.spans
	for i := range spans {
		spans[i].seq = i
	}
	slices.SortFunc(spans, func(x, y span) int {
		if c := x.p.Addr().Compare(y.p.Addr()); c != 0 {
			return c
		}
		if c := cmp.Compare(x.p.Bits(), y.p.Bits()); c != 0 {
			return c
		}
		return cmp.Compare(x.seq, y.seq)
	})
	var stack []*span
	for i := range spans {
		cur := &spans[i]
		for len(stack) > 0 && !contains(stack[len(stack)-1].p, cur.p) {
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 {
			o := stack[len(stack)-1]
			if o.site.Name != cur.site.Name {
				b.fail(cur.at, "%s (site %s) overlaps %s (site %s, %s): an address belongs to one site only",
					cur.what, cur.site.Name, o.what, o.site.Name, o.at)
			}
		}
		stack = append(stack, cur)
	}
}

// index sorts each site's nets and hosts, and builds the lookup tables of
// a map without errors.
func (b *mapBuild) index() {
	m := b.m
	for _, s := range m.sites {
		slices.SortFunc(s.Nets, func(x, y netip.Prefix) int {
			if c := x.Addr().Compare(y.Addr()); c != 0 {
				return c
			}
			return cmp.Compare(x.Bits(), y.Bits())
		})
		slices.SortFunc(s.Hosts, func(x, y Host) int { return strings.Compare(x.Name, y.Name) })
		for i := range s.Hosts {
			m.hosts[strings.ToLower(s.Hosts[i].Name)] = &s.Hosts[i]
		}
	}
	m.buildRanges(b.spans)
}

// checkGatewayAddrs refuses a gateway listening inside another site's
// address space, which would make that site's traffic look local to it,
// and indexes the gateways' addresses (on the built ranges).
func (b *mapBuild) checkGatewayAddrs() {
	m := b.m
	for _, s := range m.sites {
		for i, g := range s.Gateways {
			for _, l := range []struct {
				kind string
				ap   netip.AddrPort
			}{{"lan", g.LAN}, {"wan", g.WAN}} {
				if o, ok := m.Lookup(l.ap.Addr()); ok && o != s {
					if i == 0 {
						b.fail(b.siteAt[s.Name], "site %s: %s address %s is in site %s", s.Name, l.kind, l.ap.Addr(), o.Name)
					} else {
						b.fail(b.gwAt[s][i-1], "gateway %s: %s address %s is in site %s", s.Name, l.kind, l.ap.Addr(), o.Name)
					}
				}
				if _, taken := m.gw[l.ap.Addr()]; !taken { // sites are in id order: lowest id wins
					m.gw[l.ap.Addr()] = s
				}
			}
		}
	}
}

// contains reports whether prefix o contains prefix p (same family).
func contains(o, p netip.Prefix) bool {
	return o.Bits() <= p.Bits() && o.Contains(p.Addr())
}

// buildRanges flattens the validated spans (sorted by start) into disjoint
// ranges per family for Lookup. Overlapping spans all belong to one site, so
// merging them keeps the answer of every address.
func (m *Map) buildRanges(spans []span) {
	for _, sp := range spans {
		a := sp.p.Addr()
		if a.Is4() {
			start := addrU32(a)
			end := start | uint32((uint64(1)<<(32-sp.p.Bits()))-1)
			if n := len(m.v4start); n > 0 && m.v4site[n-1] == sp.site && (m.v4end[n-1] == ^uint32(0) || start <= m.v4end[n-1]+1) {
				m.v4end[n-1] = max(m.v4end[n-1], end)
				continue
			}
			m.v4start = append(m.v4start, start)
			m.v4end = append(m.v4end, end)
			m.v4site = append(m.v4site, sp.site)
			continue
		}
		start := addrU128(a)
		end := start
		if b := sp.p.Bits(); b < 64 {
			end.hi |= ^uint64(0) >> b
			end.lo = ^uint64(0)
		} else if b < 128 {
			end.lo |= ^uint64(0) >> (b - 64)
		}
		if n := len(m.v6start); n > 0 && m.v6site[n-1] == sp.site && !end.less(m.v6start[n-1]) && !m.v6end[n-1].less(start) {
			if m.v6end[n-1].less(end) {
				m.v6end[n-1] = end
			}
			continue
		}
		m.v6start = append(m.v6start, start)
		m.v6end = append(m.v6end, end)
		m.v6site = append(m.v6site, sp.site)
	}
}

// checkListener validates a gateway listener address that peers dial.
func checkListener(ap netip.AddrPort) string {
	if msg := checkAddr(ap.Addr()); msg != "" {
		return msg
	}
	if ap.Port() == 0 {
		return "port 0: peers need a fixed port"
	}
	return ""
}

// checkAddr rejects addresses that cannot name one node.
func checkAddr(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "invalid address"
	case a.Zone() != "":
		return "zoned IPv6 addresses are not supported"
	case a.Is4In6():
		return "IPv4-mapped; write it as " + a.Unmap().String()
	case a.IsUnspecified():
		return "unspecified address"
	}
	return ""
}

// checkSiteName: site names appear in host names (<cluster>-<n>.<site>),
// in MPI5K_GATEWAYS (site=host) and as a whitespace-separated field, so they
// are one DNS-like label.
func checkSiteName(name string) error {
	if name == "" {
		return errors.New("site: missing name")
	}
	if len(name) > 63 {
		return fmt.Errorf("invalid site name %q: longer than 63 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !isAlnum(c) && !(i > 0 && (c == '-' || c == '_')) {
			return fmt.Errorf("invalid site name %q: want letters, digits, '-' and '_', starting with a letter or digit", name)
		}
	}
	return nil
}

// checkHostName accepts an IP literal or a DNS name of labels of letters,
// digits, '-' and '_' (seen in the wild), no label starting or ending with
// '-'.
func checkHostName(name string) error {
	if _, err := netip.ParseAddr(name); err == nil && !strings.Contains(name, "%") {
		return nil
	}
	bad := func(why string) error { return fmt.Errorf("invalid host name %q: %s", name, why) }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > 253:
		return bad("longer than 253 characters")
	case strings.HasSuffix(name, "."):
		return bad("trailing dot")
	}
	for label := range strings.SplitSeq(name, ".") {
		switch {
		case label == "":
			return bad("empty label")
		case len(label) > 63:
			return bad("label longer than 63 characters")
		case label[0] == '-' || label[len(label)-1] == '-':
			return bad("label starts or ends with '-'")
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !isAlnum(c) && c != '-' && c != '_' {
				return bad(fmt.Sprintf("character %q", c))
			}
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
