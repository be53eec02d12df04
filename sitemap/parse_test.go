package sitemap

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const twoSites = `# two sites, records deliberately out of order
host site2 node-1.site2 10.77.2.10   # explicit host inside its own net
net site1 10.77.1.0/24
site site1 id=1 lan=10.77.1.2:5000 wan=10.78.1.2:5001

site site2 wan=[2001:db8:2::2]:5001 id=2 lan=10.77.2.2:5000
net site2 10.77.2.0/24
net site2 2001:db8:2::/48
host site1 gw.site1 10.77.1.2 10.78.1.2
host site2 far.example.org 192.0.2.7 2001:db8:99::7
`

func mustParse(t testing.TB, text string) *Map {
	t.Helper()
	m, err := Parse(strings.NewReader(text), "t.map")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}

func TestParseValid(t *testing.T) {
	m := mustParse(t, twoSites)
	sites := m.Sites()
	if len(sites) != 2 || sites[0].Name != "site1" || sites[1].Name != "site2" {
		t.Fatalf("sites = %v", sites)
	}
	s2 := sites[1]
	if s2.ID != 2 || s2.LAN != netip.MustParseAddrPort("10.77.2.2:5000") || s2.WAN != netip.MustParseAddrPort("[2001:db8:2::2]:5001") {
		t.Errorf("site2 = %+v", s2)
	}
	wantNets := []netip.Prefix{netip.MustParsePrefix("10.77.2.0/24"), netip.MustParsePrefix("2001:db8:2::/48")}
	if !reflect.DeepEqual(s2.Nets, wantNets) {
		t.Errorf("site2 nets = %v, want %v", s2.Nets, wantNets)
	}
	if len(s2.Hosts) != 2 || s2.Hosts[0].Name != "far.example.org" || s2.Hosts[1].Name != "node-1.site2" {
		t.Errorf("site2 hosts not sorted by name: %+v", s2.Hosts)
	}
	h, ok := m.Host("GW.Site1")
	if !ok || h.Site != "site1" || len(h.Addrs) != 2 || h.Addrs[0] != netip.MustParseAddr("10.77.1.2") {
		t.Errorf("Host(GW.Site1) = %+v, %v", h, ok)
	}
	if _, ok := m.Host("nope"); ok {
		t.Error("Host(nope) found")
	}
	if s, ok := m.Site("site2"); !ok || s != s2 {
		t.Error("Site(site2)")
	}
	if _, ok := m.Site("site3"); ok {
		t.Error("Site(site3) found")
	}
	if s, ok := m.SiteByID(1); !ok || s.Name != "site1" {
		t.Error("SiteByID(1)")
	}
	if _, ok := m.SiteByID(3); ok {
		t.Error("SiteByID(3) found")
	}
	for addr, want := range map[string]string{
		"10.77.1.2":                           "site1", // gateway LAN, in net and host
		"10.78.1.2":                           "site1", // gateway WAN, host only
		"10.77.2.10":                          "site2",
		"10.77.2.255":                         "site2",
		"::ffff:10.77.1.9":                    "site1", // IPv4-mapped
		"2001:db8:2:ffff:ffff:ffff:ffff:ffff": "site2",
		"2001:db8:99::7":                      "site2",
		"192.0.2.7":                           "site2",
		"10.77.3.1":                           "",
		"10.77.0.255":                         "",
		"192.0.2.6":                           "",
		"2001:db8:3::":                        "",
		"::":                                  "",
		"0.0.0.0":                             "",
		"255.255.255.255":                     "",
	} {
		s, ok := m.Lookup(netip.MustParseAddr(addr))
		got := ""
		if ok {
			got = s.Name
		}
		if got != want {
			t.Errorf("Lookup(%s) = %q, want %q", addr, got, want)
		}
	}
	if _, ok := m.Lookup(netip.Addr{}); ok {
		t.Error("Lookup(zero Addr) found a site")
	}
	for addr, want := range map[string]string{
		"10.77.1.2": "site1", "10.78.1.2": "site1", "2001:db8:2::2": "site2", "10.77.2.2": "site2",
		"::ffff:10.77.2.2": "site2", "10.77.1.10": "", "10.77.2.10": "",
	} {
		s, ok := m.GatewaySite(netip.MustParseAddr(addr))
		got := ""
		if ok {
			got = s.Name
		}
		if got != want {
			t.Errorf("GatewaySite(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestGatewaySharedAddress(t *testing.T) {
	// Two gateways on one machine (tests): same address, other ports.
	m := mustParse(t, "site b id=7 lan=127.0.0.1:7003 wan=127.0.0.1:7004\nsite a id=3 lan=127.0.0.1:7001 wan=127.0.0.1:7002\n")
	if s, ok := m.GatewaySite(netip.MustParseAddr("127.0.0.1")); !ok || s.Name != "a" {
		t.Errorf("GatewaySite(127.0.0.1) = %v, %v; want the lowest id (a)", s, ok)
	}
	if _, ok := m.Lookup(netip.MustParseAddr("127.0.0.1")); ok {
		t.Error("a gateway address outside every net/host must not be in a site")
	}
}

func TestParseErrors(t *testing.T) {
	const s1 = "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n" // line 1
	const s2 = "site b id=2 lan=10.0.2.2:5000 wan=10.0.2.2:5001\n" // line 2
	for _, tc := range []struct{ name, text, want string }{
		{"unknown keyword", s1 + "nett a 10.0.0.0/8\n", `t.map:2: unknown record "nett": want site, gateway, key, net or host`},
		{"site without name", "site\n", "t.map:1: site: missing name"},
		{"site name is a key", "site id=1 lan=1.1.1.1:1 wan=1.1.1.1:2\n", `t.map:1: site: missing name before "id=1"`},
		{"bad key=value", "site a id=1 lan=10.0.1.2:5000 wan 10.0.1.2:5001\n", `t.map:1: site a: bad field "wan": want key=value`},
		{"unknown key", "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001 mtu=9000\n", `t.map:1: site a: unknown key "mtu" (want id, lan, wan, ready, nat)`},
		{"ready without port", "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001 ready=10.0.1.2\n", `t.map:1: site a: bad ready address "10.0.1.2"`},
		{"ready port 0", "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001 ready=10.0.1.2:0\n", "t.map:1: site a: ready address 10.0.1.2:0: want the service gateway's --metrics address"},
		{"duplicate key", "site a id=1 id=2 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: duplicate key id"},
		{"id not a number", "site a id=x lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", `t.map:1: site a: bad id "x": want a number 1-255`},
		{"id negative", "site a id=-1 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", `t.map:1: site a: bad id "-1": want a number 1-255`},
		{"id 0", "site a id=0 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: id 0 out of range 1-255"},
		{"id 256", "site a id=256 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: id 256 out of range 1-255"},
		{"id huge", "site a id=99999999999999999999 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: id 99999999999999999999 out of range 1-255"},
		{"missing id", "site a lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: missing id="},
		{"duplicate id", s1 + "\n# c\nsite b id=1 lan=10.0.2.2:5000 wan=10.0.2.2:5001\n", "t.map:4: site b: id 1 already used by site a (t.map:1)"},
		{"duplicate site", s1 + "site a id=2 lan=10.0.2.2:5000 wan=10.0.2.2:5001\n", "t.map:2: duplicate site a (first at t.map:1)"},
		{"missing lan", "site a id=1 wan=10.0.1.2:5001\n", "t.map:1: site a has no gateway: missing lan="},
		{"missing wan", "site a id=1 lan=10.0.1.2:5001\n", "t.map:1: site a has no gateway: missing wan="},
		{"no port", "site a id=1 lan=10.0.1.2 wan=10.0.1.2:5001\n", `t.map:1: site a: bad lan address "10.0.1.2": want ip:port ([ipv6]:port)`},
		{"ipv6 without brackets", "site a id=1 lan=10.0.1.2:1 wan=2001:db8::1:5001\n", `t.map:1: site a: bad wan address "2001:db8::1:5001"`},
		{"port 0", "site a id=1 lan=10.0.1.2:0 wan=10.0.1.2:5001\n", "t.map:1: site a: lan 10.0.1.2:0: port 0: peers need a fixed port"},
		{"unspecified listener", "site a id=1 lan=0.0.0.0:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: lan 0.0.0.0:5000: unspecified address"},
		{"mapped listener", "site a id=1 lan=[::ffff:10.0.1.2]:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: lan [::ffff:10.0.1.2]:5000: IPv4-mapped; write it as 10.0.1.2"},
		{"zoned listener", "site a id=1 lan=[fe80::1%eth0]:5000 wan=10.0.1.2:5001\n", "t.map:1: site a: lan [fe80::1%eth0]:5000: zoned IPv6 addresses are not supported"},
		{"lan equals wan", "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5000\n", "t.map:1: site a: lan and wan are the same listener 10.0.1.2:5000"},
		{"listener of two sites", s1 + "site b id=2 lan=10.0.1.2:5001 wan=10.0.2.2:5001\n", "t.map:2: site b: lan 10.0.1.2:5001 is already the wan of site a (t.map:1)"},
		{"invalid site name", "site a.b id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n", `t.map:1: invalid site name "a.b"`},
		{"gateway in other site", s1 + s2 + "net b 10.0.1.0/24\n", "t.map:1: site a: lan address 10.0.1.2 is in site b"},

		{"gateway without site", s1 + "gateway lan=10.0.1.3:5000 wan=10.0.1.3:5001\n", `t.map:2: gateway: missing site name: want "gateway <site> lan=<ip:port> wan=<ip:port>"`},
		{"gateway unknown site", s1 + "gateway c lan=10.0.1.3:5000 wan=10.0.1.3:5001\n", `t.map:2: gateway: unknown site "c"`},
		{"gateway missing wan", s1 + "gateway a lan=10.0.1.3:5000\n", "t.map:2: gateway a: missing wan="},
		{"gateway site key", s1 + "gateway a id=1 lan=10.0.1.3:5000 wan=10.0.1.3:5001\n", `t.map:2: gateway a: unknown key "id" (want lan, wan; id, ready and nat are the site's)`},
		{"gateway duplicate key", s1 + "gateway a lan=10.0.1.3:5000 lan=10.0.1.3:5002\n", "t.map:2: gateway a: duplicate key lan"},
		{"gateway bad address", s1 + "gateway a lan=10.0.1.3 wan=10.0.1.3:5001\n", `t.map:2: gateway a: bad lan address "10.0.1.3": want ip:port`},
		{"gateway port 0", s1 + "gateway a lan=10.0.1.3:0 wan=10.0.1.3:5001\n", "t.map:2: gateway a: lan 10.0.1.3:0: port 0"},
		{"gateway lan equals wan", s1 + "gateway a lan=10.0.1.3:5000 wan=10.0.1.3:5000\n", "t.map:2: gateway a: lan and wan are the same listener 10.0.1.3:5000"},
		{"gateway reuses the site's", s1 + "gateway a lan=10.0.1.3:5000 wan=10.0.1.2:5001\n", "t.map:2: gateway a: wan 10.0.1.2:5001 is already the wan of site a (t.map:1)"},
		{"gateway reuses another's", s1 + "gateway a lan=10.0.1.3:5000 wan=10.0.1.3:5001\ngateway a lan=10.0.1.4:5000 wan=10.0.1.3:5000\n", "t.map:3: gateway a: wan 10.0.1.3:5000 is already the lan of gateway 2 of site a (t.map:2)"},
		{"gateway in other site's net", s1 + s2 + "gateway a lan=10.0.2.3:5000 wan=10.0.2.3:5001\nnet b 10.0.2.0/24\n", "t.map:3: gateway a: lan address 10.0.2.3 is in site b"},
		{"too many gateways", s1 + manyGateways(MaxGateways), fmt.Sprintf("t.map:%d: gateway a: more than %d gateways for one site", MaxGateways+1, MaxGateways)},

		{"net fields", s1 + "net a\n", `t.map:2: net: want "net <site> <cidr>", got 2 fields`},
		{"net extra field", s1 + "net a 10.0.0.0/8 x\n", `t.map:2: net: want "net <site> <cidr>", got 4 fields`},
		{"bad CIDR", s1 + "net a 10.0.0.0/33\n", `t.map:2: net a: bad CIDR "10.0.0.0/33"`},
		{"CIDR without length", s1 + "net a 10.0.0.0\n", `t.map:2: net a: bad CIDR "10.0.0.0"`},
		{"non-canonical CIDR", s1 + "net a 10.0.0.1/24\n", "t.map:2: net a: 10.0.0.1/24 is not canonical (host bits set); write 10.0.0.0/24"},
		{"mapped CIDR", s1 + "net a ::ffff:10.0.0.0/104\n", "t.map:2: net a: ::ffff:10.0.0.0/104 is IPv4-mapped; write it as an IPv4 CIDR"},
		{"net unknown site", s1 + "net c 10.0.0.0/8\n", `t.map:2: net 10.0.0.0/8: unknown site "c"`},
		{"duplicate net", s1 + "net a 10.0.0.0/8\nnet a 10.0.0.0/8\n", "t.map:3: net a: duplicate 10.0.0.0/8 (first at t.map:2)"},
		{"overlapping nets", s1 + s2 + "net a 10.0.0.0/8\nnet b 10.0.2.0/24\n", "t.map:4: net 10.0.2.0/24 (site b) overlaps net 10.0.0.0/8 (site a, t.map:3): an address belongs to one site only"},
		{"same net two sites", s1 + s2 + "net a 10.9.0.0/16\nnet b 10.9.0.0/16\n", "t.map:4: net 10.9.0.0/16 (site b) overlaps net 10.9.0.0/16 (site a, t.map:3)"},

		{"host fields", s1 + "host a n1\n", `t.map:2: host: want "host <site> <hostname> <addr> [<addr>...]", got 3 fields`},
		{"host bad address", s1 + "host a n1 10.0.0.300\n", `t.map:2: host n1: bad address "10.0.0.300"`},
		{"host unknown site", s1 + "host c n1 10.0.0.1\n", `t.map:2: host n1: unknown site "c"`},
		{"duplicate host", s1 + s2 + "host a n1 10.0.1.10\nhost b N1 10.0.2.10\n", "t.map:4: duplicate host N1 (first at t.map:3)"},
		{"invalid host name", s1 + "host a bad..name 10.0.0.1\n", `t.map:2: host a: invalid host name "bad..name": empty label`},
		{"host name char", s1 + "host a bad/name 10.0.0.1\n", `t.map:2: host a: invalid host name "bad/name": character '/'`},
		{"host name dash", s1 + "host a -x.y 10.0.0.1\n", `t.map:2: host a: invalid host name "-x.y": label starts or ends with '-'`},
		{"host name trailing dot", s1 + "host a x.y. 10.0.0.1\n", `t.map:2: host a: invalid host name "x.y.": trailing dot`},
		{"host address twice", s1 + "host a n1 10.0.0.1 10.0.0.1\n", "t.map:2: host n1: address 10.0.0.1 listed twice"},
		{"host unspecified", s1 + "host a n1 ::\n", "t.map:2: host n1: address ::: unspecified address"},
		{"host mapped", s1 + "host a n1 ::ffff:10.0.0.1\n", "t.map:2: host n1: address ::ffff:10.0.0.1: IPv4-mapped; write it as 10.0.0.1"},
		{"host in other site's net", s1 + s2 + "net b 10.0.2.0/24\nhost a n1 10.0.1.10 10.0.2.10\n", "t.map:4: host n1 address 10.0.2.10 (site a) overlaps net 10.0.2.0/24 (site b, t.map:3): an address belongs to one site only"},
		{"address in two hosts", s1 + s2 + "host a n1 10.0.9.1\nhost b n2 10.0.9.1\n", "t.map:4: host n2 address 10.0.9.1 (site b) overlaps host n1 address 10.0.9.1 (site a, t.map:3)"},
		{"line too long", s1 + "host a n1" + strings.Repeat(" 10.0.0.1", maxLine/9+1) + "\n", "t.map:2: line longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.text), "t.map")
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "t.map" || e.Line < 1 {
				t.Errorf("error %v is not an *Error with a position", err)
			}
		})
	}
}

// manyGateways returns n gateway records for site a.
func manyGateways(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "gateway a lan=10.0.1.3:%d wan=10.0.1.3:%d\n", 6000+2*i, 6001+2*i)
	}
	return b.String()
}

// TestGateways: a site with several gateway hosts keeps the first as LAN
// and WAN, lists all in order, and writes them back.
func TestGateways(t *testing.T) {
	text := "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001\n" +
		"gateway a wan=10.0.1.3:5001 lan=10.0.1.3:5000\n" +
		"gateway a lan=[2001:db8::3]:5000 wan=[2001:db8::3]:5001\n" +
		"site b id=2 lan=10.0.2.2:5000 wan=10.0.2.2:5001\n"
	m := mustParse(t, text)
	a, _ := m.Site("a")
	want := []Gateway{
		{netip.MustParseAddrPort("10.0.1.2:5000"), netip.MustParseAddrPort("10.0.1.2:5001")},
		{netip.MustParseAddrPort("10.0.1.3:5000"), netip.MustParseAddrPort("10.0.1.3:5001")},
		{netip.MustParseAddrPort("[2001:db8::3]:5000"), netip.MustParseAddrPort("[2001:db8::3]:5001")},
	}
	if !slices.Equal(a.Gateways, want) || a.LAN != want[0].LAN || a.WAN != want[0].WAN {
		t.Fatalf("gateways of a: %v (lan %v wan %v), want %v", a.Gateways, a.LAN, a.WAN, want)
	}
	if b, _ := m.Site("b"); len(b.Gateways) != 1 {
		t.Fatalf("gateways of b: %v", b.Gateways)
	}
	for _, ip := range []string{"10.0.1.3", "2001:db8::3"} {
		if s, ok := m.GatewaySite(netip.MustParseAddr(ip)); !ok || s.Name != "a" {
			t.Errorf("GatewaySite(%s) = %v, %v; want a", ip, s, ok)
		}
	}
	again := mustParse(t, m.String())
	if again.String() != m.String() || !strings.Contains(m.String(), "gateway a lan=10.0.1.3:5000 wan=10.0.1.3:5001\n") {
		t.Fatalf("canonical form does not round-trip:\n%s", m.String())
	}
	mb, err := NewBuilder().AddSite("a", 1, want[0].LAN, want[0].WAN).AddGateway("a", want[1].LAN, want[1].WAN).Build()
	if err != nil {
		t.Fatal(err)
	}
	if ab, _ := mb.Site("a"); !slices.Equal(ab.Gateways, want[:2]) {
		t.Fatalf("builder: gateways %v", ab.Gateways)
	}
}

func TestParseCollectsErrors(t *testing.T) {
	text := "bogus\nsite a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001\nsite b id=1 lan=x wan=y\nnet b 10.0.0.0/8\nhost a h 1.2.3\nnet a 10.0.0.1/8\n"
	_, err := Parse(strings.NewReader(text), "m")
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{"m:1: unknown record", "m:3: site b: bad lan address", "m:5: host h: bad address", "m:6: net a: 10.0.0.1/8 is not canonical"}
	if len(lines) != len(want) {
		t.Fatalf("got %d errors, want %d (no cascade from the broken site b):\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], w)
		}
	}
}

func TestInvalidSiteNameNoCascade(t *testing.T) {
	_, err := Parse(strings.NewReader("site a/b id=1 lan=10.0.0.1:1 wan=10.0.0.1:2\nnet a/b 10.0.0.0/8\nhost a/b h 10.0.0.5\n"), "m")
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), `m:1: invalid site name "a/b"`) {
		t.Errorf("want exactly the invalid-name error, got:\n%v", err)
	}
}

func TestBuilder(t *testing.T) {
	ap := netip.MustParseAddrPort
	b := NewBuilder().
		AddSite("site2", 2, ap("10.77.2.2:5000"), ap("[2001:db8:2::2]:5001")).
		AddSite("site1", 1, ap("10.77.1.2:5000"), ap("10.78.1.2:5001")).
		AddNet("site1", netip.MustParsePrefix("10.77.1.0/24")).
		AddNet("site2", netip.MustParsePrefix("10.77.2.0/24")).
		AddNet("site2", netip.MustParsePrefix("2001:db8:2::/48")).
		AddHost("site1", "gw.site1", netip.MustParseAddr("10.77.1.2"), netip.MustParseAddr("10.78.1.2")).
		AddHost("site2", "node-1.site2", netip.MustParseAddr("10.77.2.10")).
		AddHost("site2", "far.example.org", netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8:99::7"))
	m, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.String(), mustParse(t, twoSites).String(); got != want {
		t.Errorf("builder map differs from the parsed one:\n%s\nwant:\n%s", got, want)
	}
	if !reflect.DeepEqual(m.Sites(), mustParse(t, twoSites).Sites()) {
		t.Error("builder and parser sites differ")
	}

	for _, tc := range []struct {
		b    *Builder
		want string
	}{
		{NewBuilder().AddSite("a", 0, ap("10.0.0.1:1"), ap("10.0.0.1:2")), "builder:1: site a: id 0 out of range 1-255"},
		{NewBuilder().AddSite("a", 1, netip.AddrPort{}, ap("10.0.0.1:2")), "builder:1: site a has no gateway: missing lan="},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddSite("b", 1, ap("10.0.0.2:1"), ap("10.0.0.2:2")),
			"builder:2: site b: id 1 already used by site a (builder:1)"},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddNet("a", netip.MustParsePrefix("10.1.2.3/16")),
			"builder:2: net a: 10.1.2.3/16 is not canonical (host bits set); write 10.1.0.0/16"},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddNet("a", netip.Prefix{}), "builder:2: net a: invalid prefix"},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddHost("a", "h"), "builder:2: host h: no address"},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddHost("a", "h", netip.Addr{}), "builder:2: host h: address invalid IP: invalid address"},
		{NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddHost("a", "h h", netip.MustParseAddr("10.0.0.5")), `builder:2: host a: invalid host name "h h"`},
		{NewBuilder().AddSite("", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")), "builder:1: site: missing name"},
	} {
		_, err := tc.b.Build()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build error = %v, want %q", err, tc.want)
		}
	}
}

func TestBuilderDoesNotShare(t *testing.T) {
	ap := netip.MustParseAddrPort
	addrs := []netip.Addr{netip.MustParseAddr("10.0.0.5")}
	b := NewBuilder().AddSite("a", 1, ap("10.0.0.1:1"), ap("10.0.0.1:2")).AddHost("a", "h", addrs...)
	m, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	addrs[0] = netip.MustParseAddr("10.0.0.6")
	if s, ok := m.Lookup(netip.MustParseAddr("10.0.0.5")); !ok || s.Name != "a" {
		t.Error("changing the caller's slice changed the map")
	}
	if h, _ := m.Host("h"); h.Addrs[0] != netip.MustParseAddr("10.0.0.5") {
		t.Error("host addresses alias the caller's slice")
	}
}

// TestRoundTrip: canonical text parses back to an equal map whose text is
// the same, for hand-written and randomly generated maps.
func TestRoundTrip(t *testing.T) {
	check := func(t *testing.T, m *Map) {
		t.Helper()
		text := m.String()
		m2, err := Parse(strings.NewReader(text), "rt")
		if err != nil {
			t.Fatalf("canonical text does not parse: %v\n%s", err, text)
		}
		if !reflect.DeepEqual(m.Sites(), m2.Sites()) {
			t.Fatalf("round trip changed the map:\n%s\nvs\n%s", text, m2)
		}
		if m2.String() != text {
			t.Fatalf("canonical text not stable:\n%s\nvs\n%s", text, m2)
		}
		for _, s := range m.Sites() {
			for _, h := range s.Hosts {
				for _, a := range h.Addrs {
					if got, ok := m2.Lookup(a); !ok || got.Name != s.Name {
						t.Fatalf("Lookup(%s) after round trip = %v, want %s", a, got, s.Name)
					}
				}
			}
		}
	}
	t.Run("two sites", func(t *testing.T) { check(t, mustParse(t, twoSites)) })
	t.Run("ready", func(t *testing.T) {
		m := mustParse(t, "site a id=1 lan=10.0.1.2:5000 wan=10.0.1.2:5001 ready=127.0.0.1:9105\nsite b id=2 wan=10.0.2.2:5001 lan=10.0.2.2:5000\n")
		if s, _ := m.Site("a"); s.Ready != netip.MustParseAddrPort("127.0.0.1:9105") {
			t.Fatalf("ready= not read: %v", s.Ready)
		}
		check(t, m)
	})
	for seed := uint64(1); seed <= 50; seed++ {
		m, err := randomMap(seed, 1+int(seed%12), int(seed*7%120)).Build()
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		check(t, m)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sites.map")
	if err := os.WriteFile(p, []byte(twoSites), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("site x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.HasPrefix(err.Error(), p+":1: ") {
		t.Errorf("Load error %v does not start with the file name", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}
