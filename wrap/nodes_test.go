package wrap

import (
	"strings"
	"testing"
)

// TestNodeHosts: every rank host runs a node daemon; a gateway host that
// runs ranks is refused unless the gateways are dedicated, the second
// gateway host of a site (--gateway SITE=H1,H2) as the first.
func TestNodeHosts(t *testing.T) {
	h := func(name, site string) SiteHost { return SiteHost{Host: Host{Name: name}, Site: site} }
	p := &Plan{Sites: []*Site{
		{Name: "a", Hosts: []SiteHost{h("a1", "a"), h("a2", "a")}, Gateway: h("a2", "a")},
		{Name: "b", Hosts: []SiteHost{h("b1", "b")}, Gateway: h("gb", "b")},
	}}
	if _, err := nodeHosts(p.Sites, false); err == nil || !strings.Contains(err.Error(), "a2") {
		t.Errorf("gateway host with ranks: %v, want a refusal naming a2", err)
	}
	got, err := nodeHosts(p.Sites, true)
	if err != nil || len(got) != 2 || got[0].Name != "a1" || got[1].Name != "b1" {
		t.Errorf("dedicated: %v, %v; want a1, b1", got, err)
	}
	two := &Plan{Sites: []*Site{
		{Name: "c", Hosts: []SiteHost{h("c1", "c"), h("c2", "c")}, Gateway: h("gc", "c"), More: []SiteHost{h("c2", "c")}},
	}}
	if _, err := nodeHosts(two.Sites, false); err == nil || !strings.Contains(err.Error(), "c2") {
		t.Errorf("second gateway host with ranks: %v, want a refusal naming c2", err)
	}
	if got, err := nodeHosts(two.Sites, true); err != nil || len(got) != 1 || got[0].Name != "c1" {
		t.Errorf("dedicated, two gateways: %v, %v; want c1", got, err)
	}
	c := &Config{Launcher: []string{"ssh"}, NodeBin: "/opt/mpi5k", LANIf: "eth0", NodePort: 5100}
	nds := c.nodeDaemons(p.Sites, got, "/w/sites.conf")
	want := "ssh b1 /opt/mpi5k node --map /w/sites.conf --site b --lan-if eth0 --listen 127.0.0.1:5100 --exit-on-stdin-eof"
	if len(nds) != 2 || strings.Join(nds[1].argv, " ") != want {
		t.Errorf("daemon command %q, want %q", nds[1].argv, want)
	}
}
