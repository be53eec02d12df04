package sitemap

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

// randomMap builds a valid map: nSites sites, each with IPv4 and IPv6 nets
// and hostsPerSite hosts, some inside the site's nets, most outside every net
// (so the lookup table has many ranges), added in shuffled order.
func randomMap(seed uint64, nSites, hostsPerSite int) *Builder {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	type add func(b *Builder)
	var adds []add
	for k := 1; k <= nSites; k++ {
		site := fmt.Sprintf("site%d", k)
		lan := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k), 0, 2}), 5000)
		wan := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k), 0, 2}), 5001)
		if r.IntN(3) == 0 {
			wan = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(k), 15: 2}), 5001)
		}
		adds = append(adds, func(b *Builder) { b.AddSite(site, uint8(k), lan, wan) })
		adds = append(adds, func(b *Builder) {
			b.AddNet(site, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(k), 0, 0}), 16))
		})
		adds = append(adds, func(b *Builder) {
			b.AddNet(site, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(k)}), 40))
		})
		// /24s nested in the site's /16 (nesting is allowed) and scattered
		// over 172.16.0.0/12, the third octet telling the sites apart.
		seen := map[netip.Prefix]bool{}
		for j := range 1 + r.IntN(20) {
			third := byte(r.IntN(256))
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(k), third, 0}), 24)
			if j%4 != 0 {
				p = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + j%16), byte(k), 0}), 24)
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			adds = append(adds, func(b *Builder) { b.AddNet(site, p) })
		}
		for i := range hostsPerSite {
			name := fmt.Sprintf("node-%d.%s", i+1, site)
			var addrs []netip.Addr
			if r.IntN(4) == 0 {
				addrs = append(addrs, netip.AddrFrom4([4]byte{10, byte(k), byte(1 + i/250), byte(1 + i%250)}))
			}
			// Outside every net: 100.64.0.0/10, unique per (site, host), with
			// gaps so that hosts do not merge into one range.
			n := uint32(k)<<12 | uint32(2*i)
			addrs = append(addrs, netip.AddrFrom4([4]byte{100, 64 | byte(n>>16), byte(n >> 8), byte(n)}))
			if r.IntN(5) == 0 {
				addrs = append(addrs, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb9, byte(k), 14: byte(i >> 8), 15: byte(i)}))
			}
			adds = append(adds, func(b *Builder) { b.AddHost(site, name, addrs...) })
		}
	}
	r.Shuffle(len(adds), func(i, j int) { adds[i], adds[j] = adds[j], adds[i] })
	b := NewBuilder()
	for _, a := range adds {
		a(b)
	}
	return b
}

// TestLookupMatchesLinearScan compares the range table with a plain
// longest-prefix search over every net and host address.
func TestLookupMatchesLinearScan(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		m, err := randomMap(seed, 12, 90).Build()
		if err != nil {
			t.Fatal(err)
		}
		slow := func(a netip.Addr) string {
			a = a.Unmap()
			best, bits := "", -1
			for _, s := range m.Sites() {
				for _, p := range s.Nets {
					if p.Contains(a) && p.Bits() > bits {
						best, bits = s.Name, p.Bits()
					}
				}
				for _, h := range s.Hosts {
					for _, ha := range h.Addrs {
						if ha == a {
							return s.Name
						}
					}
				}
			}
			return best
		}
		r := rand.New(rand.NewPCG(seed, 1))
		var probes []netip.Addr
		for _, s := range m.Sites() {
			for _, p := range s.Nets {
				probes = append(probes, p.Addr(), lastAddr(p), p.Addr().Prev(), lastAddr(p).Next())
			}
			for _, h := range s.Hosts {
				for _, a := range h.Addrs {
					probes = append(probes, a, a.Next(), a.Prev())
				}
			}
		}
		for range 4000 {
			probes = append(probes, netip.AddrFrom4([4]byte{[]byte{10, 100, 172, 11}[r.IntN(4)], byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}))
			var b [16]byte
			b[0], b[1], b[2], b[3], b[4] = 0x20, 0x01, 0x0d, byte(0xb8+r.IntN(2)), byte(r.IntN(16))
			b[15] = byte(r.IntN(256))
			probes = append(probes, netip.AddrFrom16(b))
		}
		for _, a := range probes {
			if !a.IsValid() {
				continue
			}
			s, ok := m.Lookup(a)
			got := ""
			if ok {
				got = s.Name
			}
			if want := slow(a); got != want {
				t.Fatalf("seed %d: Lookup(%s) = %q, linear scan says %q", seed, a, got, want)
			}
			if a.Is4() {
				if s2, ok2 := m.Lookup(netip.AddrFrom16(a.As16())); ok2 != ok || s2 != s {
					t.Fatalf("Lookup of IPv4-mapped %s differs", a)
				}
			}
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestLookupEdgesOfAddressSpace(t *testing.T) {
	m := mustParse(t, "site a id=1 lan=10.0.0.1:1 wan=10.0.0.1:2\n"+
		"site b id=2 lan=200.0.0.2:1 wan=200.0.0.2:2\n"+
		"net a 0.0.0.0/1\nnet b 128.0.0.0/1\nnet a ::/1\nnet b 8000::/1\n")
	for addr, want := range map[string]string{"0.0.0.0": "a", "127.255.255.255": "a", "128.0.0.0": "b", "255.255.255.255": "b",
		"::": "a", "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": "a", "8000::": "b", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": "b"} {
		if s, ok := m.Lookup(netip.MustParseAddr(addr)); !ok || s.Name != want {
			t.Errorf("Lookup(%s) = %v, %v; want %s", addr, s, ok, want)
		}
	}
}

func TestLookupConcurrent(t *testing.T) {
	m, err := randomMap(3, 10, 100).Build()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for _, s := range m.Sites() {
				for _, h := range s.Hosts {
					if got, ok := m.Lookup(h.Addrs[len(h.Addrs)-1]); !ok || got != s {
						t.Errorf("goroutine %d: Lookup(%s) = %v", g, h.Addrs[0], got)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestLookupAllocs(t *testing.T) {
	m, err := randomMap(1, 10, 100).Build()
	if err != nil {
		t.Fatal(err)
	}
	a4, a6 := netip.MustParseAddr("10.3.7.7"), netip.MustParseAddr("2001:db8:3::7")
	mapped := netip.MustParseAddr("::ffff:10.3.7.7")
	if n := testing.AllocsPerRun(100, func() { m.Lookup(a4); m.Lookup(a6); m.Lookup(mapped); m.GatewaySite(a4) }); n != 0 {
		t.Errorf("Lookup allocates %v times per run", n)
	}
}

func benchMap(b *testing.B) *Map {
	m, err := randomMap(42, 16, 100).Build() // 16 sites, 1600 hosts, ~170 nets
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func BenchmarkLookup(b *testing.B) {
	m := benchMap(b)
	var hosts, nets []netip.Addr
	for _, s := range m.Sites() {
		for _, h := range s.Hosts {
			hosts = append(hosts, h.Addrs[len(h.Addrs)-1])
		}
		for _, p := range s.Nets {
			nets = append(nets, p.Addr().Next())
		}
	}
	miss := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("100.127.255.1"),
		netip.MustParseAddr("2001:db8:ff::1"), netip.MustParseAddr("8.8.8.8")}
	if len(hosts) < 1000 || len(m.Sites()) < 10 {
		b.Fatalf("map too small: %d sites, %d hosts", len(m.Sites()), len(hosts))
	}
	b.Logf("%d sites, %d hosts, %d nets, %d+%d ranges", len(m.Sites()), len(hosts), len(nets), len(m.v4start), len(m.v6start))
	run := func(name string, probes []netip.Addr, want bool) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, ok := m.Lookup(probes[i]); ok != want {
					b.Fatalf("Lookup(%s) = %v", probes[i], ok)
				}
				if i++; i == len(probes) {
					i = 0
				}
			}
		})
	}
	run("host", hosts, true)
	run("net", nets, true)
	run("miss", miss, false)
	mapped := make([]netip.Addr, 0, len(hosts))
	for _, a := range hosts {
		if a.Is4() {
			mapped = append(mapped, netip.AddrFrom16(a.As16()))
		}
	}
	run("host-v4mapped", mapped, true)
}

func BenchmarkParse(b *testing.B) {
	text := benchMap(b).String()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(strings.NewReader(text), "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
