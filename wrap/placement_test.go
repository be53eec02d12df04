package wrap

import (
	"strings"
	"testing"
)

// TestPlacementNote: one line naming every site whose gateway host also
// runs ranks, none with --dedicated-gateways or gateways outside the job.
func TestPlacementNote(t *testing.T) {
	host := func(n string) SiteHost { return SiteHost{Host: Host{Name: n}} }
	plan := &Plan{Sites: []*Site{
		{Name: "a", Hosts: []SiteHost{host("a1"), host("a2")}, Gateway: host("a2")},
		{Name: "b", Hosts: []SiteHost{host("b1")}, Gateway: host("gw-b")},
		{Name: "c", Hosts: []SiteHost{host("c1"), host("c2")}, Gateway: host("c1")},
	}}
	got := placementNote(plan, false)
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, "(a=a2, c=c1)") ||
		!strings.Contains(got, "--dedicated-gateways") || !strings.Contains(got, "--gateway SITE=HOST") {
		t.Errorf("shared gateway hosts: %q", got)
	}
	if got := placementNote(plan, true); got != "" {
		t.Errorf("--dedicated-gateways: %q, want nothing", got)
	}
	plan.Sites = plan.Sites[1:2]
	if got := placementNote(plan, false); got != "" {
		t.Errorf("gateway outside the job: %q, want nothing", got)
	}
}
