package node

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// TestResolveGateways: a gateway whose MAC does not resolve is left out,
// with a warning naming it, while another resolves; with none, the error
// names each; a site of one gateway fails with that gateway's error.
func TestResolveGateways(t *testing.T) {
	gw1 := netip.MustParseAddrPort("10.9.0.1:4000")
	gw2 := netip.MustParseAddrPort("10.9.0.2:4000")
	site := &sitemap.Site{Name: "a", LAN: gw1, Gateways: []sitemap.Gateway{{LAN: gw1}, {LAN: gw2}}}
	mac1 := mx.MAC{2, 0, 0, 0, 9, 1}
	only := func(ok netip.AddrPort) func(netip.AddrPort) (mx.MAC, error) {
		return func(gw netip.AddrPort) (mx.MAC, error) {
			if gw == ok {
				return mac1, nil
			}
			return mx.MAC{}, errors.New("no MAC for " + gw.Addr().String())
		}
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	got, err := resolveGateways(site, only(gw1), log)
	if err != nil || len(got) != 1 || got[0].LAN != gw1 || got[0].MX.MAC != mac1 {
		t.Fatalf("one of two resolves: %+v, %v; want gateway %v alone", got, err, gw1)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "gateway="+gw2.String()) {
		t.Errorf("no warning naming the gateway left out: %q", logs.String())
	}
	got, err = resolveGateways(site, only(netip.AddrPort{}), log)
	if err == nil || !strings.Contains(err.Error(), "10.9.0.1") || !strings.Contains(err.Error(), "10.9.0.2") {
		t.Errorf("none resolves: %+v, %v; want an error naming both", got, err)
	}
	one := &sitemap.Site{Name: "b", LAN: gw1, Gateways: []sitemap.Gateway{{LAN: gw1}}}
	if _, err := resolveGateways(one, only(netip.AddrPort{}), log); err == nil || err.Error() != "no MAC for 10.9.0.1" {
		t.Errorf("single gateway: %v, want its own error", err)
	}
	got, err = resolveGateways(site, func(netip.AddrPort) (mx.MAC, error) { return mac1, nil }, log)
	if err != nil || len(got) != 2 || got[1].LAN != gw2 {
		t.Errorf("both resolve: %+v, %v", got, err)
	}
}
