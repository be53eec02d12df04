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
	var errs []*Error
	fail := func(at pos, format string, args ...any) {
		errs = append(errs, &Error{File: at.file, Line: at.line, Msg: fmt.Sprintf(format, args...)})
	}
	m := &Map{
		byName: map[string]*Site{},
		hosts:  map[string]*Host{},
		gw:     map[netip.Addr]*Site{},
	}
	siteAt := map[string]pos{}
	idAt := map[int]*siteRec{}
	type listener struct {
		site, kind string
		at         pos
	}
	listeners := map[netip.AddrPort]listener{}
	// claim checks one gateway's two listeners (the n-th of its site) and
	// claims them; who starts the messages ("site X", "gateway X").
	claim := func(at pos, who, site, missing string, lan, wan netip.AddrPort, n int) bool {
		ok := true
		for _, l := range []struct {
			kind string
			ap   netip.AddrPort
		}{{"lan", lan}, {"wan", wan}} {
			if !l.ap.IsValid() {
				fail(at, "%s%s=", missing, l.kind)
				ok = false
				continue
			}
			if msg := checkListener(l.ap); msg != "" {
				fail(at, "%s: %s %s: %s", who, l.kind, l.ap, msg)
				ok = false
				continue
			}
			if o, dup := listeners[l.ap]; dup {
				if o.at == at {
					fail(at, "%s: lan and wan are the same listener %s", who, l.ap)
				} else {
					fail(at, "%s: %s %s is already the %s of site %s (%s)", who, l.kind, l.ap, o.kind, o.site, o.at)
				}
				ok = false
				continue
			}
			kind := l.kind
			if n > 1 {
				kind = fmt.Sprintf("%s of gateway %d", l.kind, n)
			}
			listeners[l.ap] = listener{site, kind, at}
		}
		return ok
	}

	for i := range r.sites {
		rec := &r.sites[i]
		if err := checkSiteName(rec.name); err != nil {
			fail(rec.at, "%v", err)
			if knownBroken == nil {
				knownBroken = map[string]bool{}
			}
			knownBroken[rec.name] = true
			continue
		}
		if first, dup := siteAt[rec.name]; dup {
			fail(rec.at, "duplicate site %s (first at %s)", rec.name, first)
			continue
		}
		siteAt[rec.name] = rec.at
		ok := true
		switch {
		case rec.id == 0:
			fail(rec.at, "site %s: missing id=", rec.name)
			ok = false
		case rec.id < 1 || rec.id > 255:
			fail(rec.at, "site %s: id %d out of range 1-255", rec.name, max(rec.id, 0))
			ok = false
		case idAt[rec.id] != nil:
			o := idAt[rec.id]
			fail(rec.at, "site %s: id %d already used by site %s (%s)", rec.name, rec.id, o.name, o.at)
			ok = false
		default:
			idAt[rec.id] = rec
		}
		if !claim(rec.at, "site "+rec.name, rec.name, "site "+rec.name+" has no gateway: missing ", rec.lan, rec.wan, 1) {
			ok = false
		}
		if !ok {
			// Keep the name known so its nets and hosts are still checked
			// without a cascade of "unknown site" errors.
			if knownBroken == nil {
				knownBroken = map[string]bool{}
			}
			knownBroken[rec.name] = true
			continue
		}
		if rec.ready.IsValid() && (rec.ready.Port() == 0 || rec.ready.Addr().IsUnspecified()) {
			fail(rec.at, "site %s: ready address %s: want the service gateway's --metrics address, with a port and not unspecified", rec.name, rec.ready)
		}
		s := &Site{Name: rec.name, ID: uint8(rec.id), LAN: rec.lan, WAN: rec.wan, Ready: rec.ready, NAT: rec.nat,
			Gateways: []Gateway{{rec.lan, rec.wan}}}
		m.byName[s.Name] = s
		m.byID[s.ID] = s
		m.sites = append(m.sites, s)
	}
	gwAt := map[*Site][]pos{} // the gateway records of each site's extra gateways
	for _, rec := range r.gateways {
		s := m.byName[rec.site]
		if s == nil {
			if !knownBroken[rec.site] {
				fail(rec.at, "gateway: unknown site %q", rec.site)
			}
			continue
		}
		n := len(s.Gateways) + 1
		if n > MaxGateways {
			fail(rec.at, "gateway %s: more than %d gateways for one site", rec.site, MaxGateways)
			continue
		}
		ok := claim(rec.at, "gateway "+rec.site, rec.site, "gateway "+rec.site+": missing ", rec.lan, rec.wan, n)
		if ok {
			s.Gateways = append(s.Gateways, Gateway{rec.lan, rec.wan})
			gwAt[s] = append(gwAt[s], rec.at)
		}
	}
	slices.SortFunc(m.sites, func(a, b *Site) int { return cmp.Compare(a.ID, b.ID) })

	// site resolves a record's site, reporting an unknown one; broken
	// sites get a placeholder so overlap checks still run.
	placeholders := map[string]*Site{}
	site := func(at pos, kind, what, name string) *Site {
		if s := m.byName[name]; s != nil {
			return s
		}
		if knownBroken[name] {
			if placeholders[name] == nil {
				placeholders[name] = &Site{Name: name}
			}
			return placeholders[name]
		}
		fail(at, "%s %s: unknown site %q", kind, what, name)
		return nil
	}

	var spans []span
	type siteNet struct {
		site string
		p    netip.Prefix
	}
	netAt := map[siteNet]pos{}
	for _, rec := range r.nets {
		p := rec.prefix
		if !p.IsValid() {
			fail(rec.at, "net %s: invalid prefix", rec.site)
			continue
		}
		s := site(rec.at, "net", p.String(), rec.site)
		if s == nil {
			continue
		}
		switch {
		case p.Addr().Is4In6():
			fail(rec.at, "net %s: %s is IPv4-mapped; write it as an IPv4 CIDR", rec.site, p)
			continue
		case p.Masked() != p:
			fail(rec.at, "net %s: %s is not canonical (host bits set); write %s", rec.site, p, p.Masked())
			continue
		}
		if first, dup := netAt[siteNet{rec.site, p}]; dup {
			fail(rec.at, "net %s: duplicate %s (first at %s)", rec.site, p, first)
			continue
		}
		netAt[siteNet{rec.site, p}] = rec.at
		spans = append(spans, span{p: p, site: s, what: "net " + p.String(), at: rec.at})
		s.Nets = append(s.Nets, p)
	}

	hostAt := map[string]pos{}
	for i := range r.hosts {
		rec := &r.hosts[i]
		if err := checkHostName(rec.name); err != nil {
			fail(rec.at, "host %s: %v", rec.site, err)
			continue
		}
		s := site(rec.at, "host", rec.name, rec.site)
		if s == nil {
			continue
		}
		key := strings.ToLower(rec.name)
		if first, dup := hostAt[key]; dup {
			fail(rec.at, "duplicate host %s (first at %s)", rec.name, first)
			continue
		}
		hostAt[key] = rec.at
		if len(rec.addrs) == 0 {
			fail(rec.at, "host %s: no address", rec.name)
			continue
		}
		ok := true
		seen := map[netip.Addr]bool{}
		for _, a := range rec.addrs {
			if msg := checkAddr(a); msg != "" {
				fail(rec.at, "host %s: address %s: %s", rec.name, a, msg)
				ok = false
				continue
			}
			if seen[a] {
				fail(rec.at, "host %s: address %s listed twice", rec.name, a)
				ok = false
				continue
			}
			seen[a] = true
		}
		if !ok {
			continue
		}
		for _, a := range rec.addrs {
			spans = append(spans, span{p: netip.PrefixFrom(a, a.BitLen()), site: s,
				what: "host " + rec.name + " address " + a.String(), at: rec.at})
		}
		s.Hosts = append(s.Hosts, Host{Name: rec.name, Site: s.Name, Addrs: slices.Clone(rec.addrs)})
	}

	// Overlaps between sites. Prefixes are either nested or disjoint, so
	// after sorting by start address (then shorter first), a stack of
	// enclosing prefixes finds every prefix's nearest container.
	for i := range spans {
		spans[i].seq = i
	}
	slices.SortFunc(spans, func(a, b span) int {
		if c := a.p.Addr().Compare(b.p.Addr()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.p.Bits(), b.p.Bits()); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
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
				fail(cur.at, "%s (site %s) overlaps %s (site %s, %s): an address belongs to one site only",
					cur.what, cur.site.Name, o.what, o.site.Name, o.at)
			}
		}
		stack = append(stack, cur)
	}

	r.buildKeys(m, knownBroken, fail)
	r.checkNAT(m, fail)
	if len(errs) > 0 {
		return nil, errs
	}

	for _, s := range m.sites {
		slices.SortFunc(s.Nets, func(a, b netip.Prefix) int {
			if c := a.Addr().Compare(b.Addr()); c != 0 {
				return c
			}
			return cmp.Compare(a.Bits(), b.Bits())
		})
		slices.SortFunc(s.Hosts, func(a, b Host) int { return strings.Compare(a.Name, b.Name) })
		for i := range s.Hosts {
			m.hosts[strings.ToLower(s.Hosts[i].Name)] = &s.Hosts[i]
		}
	}
	m.buildRanges(spans)

	// A gateway listening inside another site's address space would make
	// that site's traffic look local to it.
	for _, s := range m.sites {
		for i, g := range s.Gateways {
			for _, l := range []struct {
				kind string
				ap   netip.AddrPort
			}{{"lan", g.LAN}, {"wan", g.WAN}} {
				if o, ok := m.Lookup(l.ap.Addr()); ok && o != s {
					if i == 0 {
						fail(siteAt[s.Name], "site %s: %s address %s is in site %s", s.Name, l.kind, l.ap.Addr(), o.Name)
					} else {
						fail(gwAt[s][i-1], "gateway %s: %s address %s is in site %s", s.Name, l.kind, l.ap.Addr(), o.Name)
					}
				}
				if _, taken := m.gw[l.ap.Addr()]; !taken { // sites are in id order: lowest id wins
					m.gw[l.ap.Addr()] = s
				}
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return m, nil
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
