// Package sitemap says which site every node address belongs to, gives each
// site its numeric id and its gateway's listeners, and answers "which site is
// this address in" fast enough to run on every intercepted connect.
//
// A Map comes from the text format (Parse, Load; see docs/sitemap-format.md)
// or from a Builder; both share one validation, so a Map always satisfies
// every rule of the format. A Map is immutable: any number of goroutines may
// read it concurrently. The *Site and *Host values it hands out belong to the
// Map and must not be modified.
package sitemap

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// Site is one site: its gateway's listeners and the addresses of its nodes.
type Site struct {
	Name string
	ID   uint8          // 1..255, unique in the map
	LAN  netip.AddrPort // gateway listener for the site's own nodes (shims)
	WAN  netip.AddrPort // gateway listener for peer gateways
	// Ready, if valid, is the HTTP listener (--metrics) of the site's
	// service gateway: `mpi5k run` uses that gateway when its /ready
	// answers, and starts none of its own for the site.
	Ready netip.AddrPort
	// NAT: the gateway cannot be reached at WAN from other sites (it is
	// behind NAT, nat=yes): it dials every peer (Dials). Needs keys.
	NAT  bool
	Nets []netip.Prefix // sorted by address, then length
	// Hosts are the site's explicit hosts, sorted by name.
	Hosts []Host
	// Keys are the public keys its gateway may prove (key records, in
	// their order): several while a key is replaced.
	Keys []ed25519.PublicKey
	// Gateways are the site's gateway hosts: the first is LAN and WAN
	// above (the site record's), the others come from gateway records,
	// in their order.
	Gateways []Gateway
}

// Gateway is one gateway host of a site: its two listeners.
type Gateway struct {
	LAN netip.AddrPort // for the site's own nodes (shims)
	WAN netip.AddrPort // for peer gateways
}

// MaxGateways is the most gateway hosts a site may list.
const MaxGateways = 16

// Host is an explicitly listed host. Addrs keep the order of the record:
// the first one is the host's main address.
type Host struct {
	Name  string
	Site  string
	Addrs []netip.Addr
}

// Map is a validated, immutable site map.
type Map struct {
	sites  []*Site // sorted by id
	byName map[string]*Site
	byID   [256]*Site
	hosts  map[string]*Host // key: lower-case name (host names are case-insensitive)
	gw     map[netip.Addr]*Site

	// The address space as disjoint ranges sorted by start; validation
	// guarantees an address is in at most one site, so the range that
	// contains an address is its longest-prefix match as well.
	v4start []uint32
	v4end   []uint32
	v4site  []*Site
	v6start []u128
	v6end   []u128
	v6site  []*Site
}

type u128 struct{ hi, lo uint64 }

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

func addrU128(a netip.Addr) u128 {
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// Lookup returns the site that address a is in: an explicit host address or
// an address inside one of a site's nets. IPv4-mapped IPv6 addresses are
// looked up as IPv4; zones are ignored. It does not allocate.
func (m *Map) Lookup(a netip.Addr) (*Site, bool) {
	if a.Is4In6() {
		a = a.Unmap()
	}
	if a.Is4() {
		x := addrU32(a)
		s := m.v4start
		lo, hi := 0, len(s)
		for lo < hi { // first index whose start is > x
			mid := int(uint(lo+hi) >> 1)
			if s[mid] <= x {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo > 0 && x <= m.v4end[lo-1] {
			return m.v4site[lo-1], true
		}
		return nil, false
	}
	if !a.Is6() {
		return nil, false
	}
	x := addrU128(a)
	s := m.v6start
	lo, hi := 0, len(s)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if !x.less(s[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo > 0 && !m.v6end[lo-1].less(x) {
		return m.v6site[lo-1], true
	}
	return nil, false
}

// Site returns the site named name.
func (m *Map) Site(name string) (*Site, bool) {
	s, ok := m.byName[name]
	return s, ok
}

// SiteByID returns the site whose id is id.
func (m *Map) SiteByID(id uint8) (*Site, bool) {
	s := m.byID[id]
	return s, s != nil
}

// Sites returns every site sorted by id. The slice is a copy; the sites are not.
func (m *Map) Sites() []*Site {
	return append([]*Site(nil), m.sites...)
}

// Host returns the explicit host named name (case-insensitive).
func (m *Map) Host(name string) (*Host, bool) {
	h, ok := m.hosts[strings.ToLower(name)]
	return h, ok
}

// GatewaySite reports whether a is the address of a gateway listener (LAN
// or WAN) and of which site. Several sites may share a gateway address with
// different ports (gateways on one machine, in tests); the lowest id wins.
func (m *Map) GatewaySite(a netip.Addr) (*Site, bool) {
	s, ok := m.gw[a.Unmap().WithZone("")]
	return s, ok
}

// WriteTo writes the map in canonical text form: per site (by id) its site
// record, its keys, its nets, then its hosts. Parse reads it back to an equal Map.
func (m *Map) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	for i, s := range m.sites {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "site %s id=%d lan=%s wan=%s", s.Name, s.ID, s.LAN, s.WAN)
		if s.Ready.IsValid() {
			fmt.Fprintf(&b, " ready=%s", s.Ready)
		}
		if s.NAT {
			b.WriteString(" nat=yes")
		}
		b.WriteByte('\n')
		for _, g := range s.Gateways[1:] {
			fmt.Fprintf(&b, "gateway %s lan=%s wan=%s\n", s.Name, g.LAN, g.WAN)
		}
		for _, k := range s.Keys {
			fmt.Fprintf(&b, "key %s %s\n", s.Name, FormatKey(k))
		}
		for _, p := range s.Nets {
			fmt.Fprintf(&b, "net %s %s\n", s.Name, p)
		}
		for _, h := range s.Hosts {
			fmt.Fprintf(&b, "host %s %s", s.Name, h.Name)
			for _, a := range h.Addrs {
				b.WriteByte(' ')
				b.WriteString(a.String())
			}
			b.WriteByte('\n')
		}
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

// String returns the canonical text (see WriteTo).
func (m *Map) String() string {
	var b strings.Builder
	m.WriteTo(&b)
	return b.String()
}

// Load reads and validates the site map file at path.
func Load(path string) (*Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("site map: %w", err)
	}
	defer f.Close()
	return Parse(f, path)
}
