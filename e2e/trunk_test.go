package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestLabWANTrunk: on BBR hosts, `mpi5k run --wan-trunk auto` carries the
// chaos job over a link per stream: each gateway logs the parallel preset,
// chosen by its host's bbr, with 8 links and no express link. With one
// site's gateway host switched to reno the two gateways choose differently;
// they refuse each other's links, and the run ends at its ready timeout
// with the gateways' last log lines, which name --wan-trunk and what each
// host's TCP chose.
func TestLabWANTrunk(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6, HostCC: "bbr"})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()

	w := startWrapped(t, l, m, bin, dir, "auto", "2", "--keep", "--wan-trunk", "auto")
	w.finish(t, m, 90*time.Second)
	for _, site := range []string{"site1", "site2"} {
		b, err := os.ReadFile(filepath.Join(w.work, "gateway-"+site+".log"))
		if err != nil {
			t.Fatal(err)
		}
		up := ""
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `msg="gateway up"`) {
				up = line
			}
		}
		for _, want := range []string{" trunk=parallel ", " trunk_by_host_cc=bbr ", " wan_conns=8 ", " express=false "} {
			if !strings.Contains(up, want) {
				t.Errorf("%s's gateway up line lacks %q:\n%s", site, want, up)
			}
		}
	}

	if out, err := l.Command("gw.site2", "sysctl", "-w", "net.ipv4.tcp_congestion_control=reno").CombinedOutput(); err != nil {
		t.Fatalf("gw.site2 to reno: %v\n%s", err, out)
	}
	t.Cleanup(func() { l.Command("gw.site2", "sysctl", "-w", "net.ipv4.tcp_congestion_control=bbr").Run() })
	w = startWrapped(t, l, m, bin, dir, "mixed", "2", "--keep", "--wan-trunk", "auto", "--ready-timeout", "10s")
	if !w.waitExit(60 * time.Second) {
		t.Fatalf("mpi5k run with refused links still runs 60 s on:\n%s", w.out.String())
	}
	out := w.out.String()
	if code := w.cmd.ProcessState.ExitCode(); code == 0 || strings.Contains(out, "chaos_mpi ok") {
		t.Fatalf("gateways of different trunks carried the job (exit %d):\n%s", code, out)
	}
	for _, want := range []string{"gateways not ready after 10s", "gateway log (", "the same --wan-trunk", "--wan-trunk auto chose "} {
		if !strings.Contains(out, want) {
			t.Errorf("the run's error lacks %q:\n%s", want, lastLines(out, 30))
		}
	}
	t.Logf("%s", lastLines(out, 12))
}
