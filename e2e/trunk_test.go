package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestLabWANTrunk: on BBR hosts, `mpi5k run` with its default
// --wan-trunk auto carries the chaos job over a link per stream: each
// gateway logs the parallel preset, picked by its host's bbr, with 8 links
// and no express link. With one site's gateway host switched to reno the
// two gateways pick differently and agree on the shared trunk: the job
// runs, the BBR site's gateway logs the agreement (2 links, the express
// link among them), and the reno site's keeps its own pick.
func TestLabWANTrunk(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6, HostCC: "bbr"})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	logOf := func(w *wrappedJob, site string) string {
		b, err := os.ReadFile(filepath.Join(w.work, "gateway-"+site+".log"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	line := func(log, msg string) string {
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, `msg="`+msg+`"`) {
				return l
			}
		}
		return ""
	}
	want := func(what, line string, parts ...string) {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				t.Errorf("%s lacks %q:\n%s", what, p, line)
			}
		}
	}

	w := startWrapped(t, l, m, bin, dir, "auto", "2", "--keep")
	w.finish(t, m, 90*time.Second)
	for _, site := range []string{"site1", "site2"} {
		log := logOf(w, site)
		want(site+"'s gateway up line", line(log, "gateway up"), " trunk=parallel ", " trunk_by_host_cc=bbr ", " trunk_agreed_per_pair=true ", " wan_conns=8 ", " express=false ")
		if a := line(log, "site pair trunk agreed"); a != "" {
			t.Errorf("%s changed its layout beside a peer of the same pick:\n%s", site, a)
		}
	}

	if out, err := l.Command("gw.site2", "sysctl", "-w", "net.ipv4.tcp_congestion_control=reno").CombinedOutput(); err != nil {
		t.Fatalf("gw.site2 to reno: %v\n%s", err, out)
	}
	t.Cleanup(func() { l.Command("gw.site2", "sysctl", "-w", "net.ipv4.tcp_congestion_control=bbr").Run() })
	w = startWrapped(t, l, m, bin, dir, "mixed", "2", "--keep")
	w.finish(t, m, 90*time.Second)
	one, two := logOf(w, "site1"), logOf(w, "site2")
	want("site1's gateway up line", line(one, "gateway up"), " trunk=parallel ", " trunk_by_host_cc=bbr ")
	want("site2's gateway up line", line(two, "gateway up"), " trunk=shared ", " trunk_by_host_cc=reno ", " express=true ")
	want("site1's agreement", line(one, "site pair trunk agreed"), " peer=site2 ", " trunk=shared ", " was=parallel ", " links=2 ", " express=true")
	if a := line(two, "site pair trunk agreed"); a != "" {
		t.Errorf("site2 changed from its own shared pick:\n%s", a)
	}
	for site, log := range map[string]string{"site1": one, "site2": two} {
		if strings.Contains(log, "WAN connection refused") {
			t.Errorf("%s refused its peer; site1's log:\n%s\nsite2's log:\n%s", site, lastLines(one, 40), lastLines(two, 40))
		}
	}
}
