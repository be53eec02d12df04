package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestWrapTwoGatewaysPerSite: `mpi5k run --gateway SITE=HOST1,HOST2`
// starts a gateway on each of two hosts per site (the lab's gateway host
// and node-2), the four form a mesh of four gateway pairs, and an MPI job
// runs through them; the summary reports every gateway and its links to
// both gateways of the other site.
func TestWrapTwoGatewaysPerSite(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "mgw" + itoa4(), Nodes: 2, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte(m.hostfile), 0o644)
	argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, "w"),
		"--gateway", "site1=gw.site1,node-2.site1", "--gateway", "site2=gw.site2,node-2.site2"}, m.argv(bin, hf, "2")...)
	out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 120 * time.Second, Done: "chaos_mpi ok"}.run(t, l)
	checkFourGatewayPairs(t, out)
	// The job's connections crossed the gateways.
	opened := streamsOpened(out, `\S+`)
	if opened == 0 {
		t.Errorf("no gateway opened a stream: the job's connections did not cross the gateways:\n%s", lastLines(out, 30))
	}
	mp, err := os.ReadFile(filepath.Join(dir, "w", "sites.conf"))
	if err == nil && !strings.Contains(string(mp), "gateway site1 lan=") {
		t.Errorf("the job's map has no gateway record for site1's second host:\n%s", mp)
	}
	t.Logf("%d streams opened; %s", opened, lastLines(out, 30))
}

// TestMXTwoGatewaysPerSite: `mpi5k run --lan-transport mx --gateway
// SITE=HOST1,HOST2`: the MX gateways of each site run on its gateway host
// and node-2, the node daemon of node-1 (the ranks' host) reaches both,
// and an MPI job that verifies its messages runs through them. The job
// runs twice, launched on either site's node-1, whose ranks then open
// the job's two inter-site connections (the ping-pong and the
// broadcast's first step): its node daemon puts one on each of its
// site's gateways, round robin, so each run's summary counts a stream
// opened by both gateways of the launching site, and the two runs by all
// four.
func TestMXTwoGatewaysPerSite(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "mxg" + itoa4(), Nodes: 2, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	for _, sites := range [][2]string{{"site1", "site2"}, {"site2", "site1"}} {
		t.Run("from-"+sites[0], func(t *testing.T) {
			dir := t.TempDir()
			hf := filepath.Join(dir, "hosts")
			// Four ranks, two per site, alternating (--map-by node):
			// rank 0 on sites[0], where mpirun runs, the last rank on
			// sites[1].
			os.WriteFile(hf, []byte(fmt.Sprintf("node-1.%s slots=2\nnode-1.%s slots=2\n", sites[0], sites[1])), 0o644)
			job := m.argv(bin, hf, "1")
			job = append([]string{job[0], "--map-by", "node"}, job[1:]...)
			for i := range job {
				if job[i] == "-np" {
					job[i+1] = "4"
				}
			}
			argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, "w"),
				"--lan-transport", "mx", "--lan-if", "eth0",
				"--gateway", "site1=gw.site1,node-2.site1", "--gateway", "site2=gw.site2,node-2.site2"}, job...)
			out := mpiJob{Host: "node-1." + sites[0], Argv: argv, Dir: dir, Timeout: 60 * time.Second, Done: "chaos_mpi ok",
				Tries: 2, AcceptHang: m.finalizeMayHang}.run(t, l)
			checkFourGatewayPairs(t, out)
			// Streams opened by each gateway of the launching site.
			for _, gw := range []string{sites[0], sites[0] + "@node-2." + sites[0]} {
				if streamsOpened(out, regexp.QuoteMeta(gw)) == 0 {
					t.Errorf("gateway %s opened no stream: the node daemon did not spread the job's connections over its site's gateways:\n%s",
						gw, lastLines(out, 30))
				}
			}
			t.Logf("%s", lastLines(out, 30))
		})
	}
}

// checkFourGatewayPairs: the wrapper's summary of a job on two sites of
// two gateways each (gw and node-2) has a line for every gateway's link
// to each gateway of the other site.
func checkFourGatewayPairs(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"site1 -> site2:", "site1 -> site2/1:", "site1@node-2.site1 -> site2:", "site1@node-2.site1 -> site2/1:",
		"site2 -> site1:", "site2 -> site1/1:", "site2@node-2.site2 -> site1:", "site2@node-2.site2 -> site1/1:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, lastLines(out, 30))
		}
	}
}

// streamsOpened sums the streams opened on the summary's lines of the
// gateways whose label matches the regular expression gw.
func streamsOpened(out, gw string) int {
	re := regexp.MustCompile(`(?m)^\s+` + gw + ` -> [^:]+: .*, (\d+) streams opened`)
	opened := 0
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		opened += n
	}
	return opened
}
