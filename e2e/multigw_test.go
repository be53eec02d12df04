package e2e

import (
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
	for _, want := range []string{
		"site1 -> site2:", "site1 -> site2/1:", "site1@node-2.site1 -> site2:", "site1@node-2.site1 -> site2/1:",
		"site2 -> site1:", "site2 -> site1/1:", "site2@node-2.site2 -> site1:", "site2@node-2.site2 -> site1/1:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, lastLines(out, 30))
		}
	}
	// The job's connections crossed the gateways: streams opened, summed
	// over the summary's lines.
	opened := 0
	for _, m := range regexp.MustCompile(` -> [^:]+: .*, (\d+) streams opened`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		opened += n
	}
	if opened == 0 {
		t.Errorf("no gateway opened a stream: the job's connections did not cross the gateways:\n%s", lastLines(out, 30))
	}
	mp, err := os.ReadFile(filepath.Join(dir, "w", "sites.conf"))
	if err == nil && !strings.Contains(string(mp), "gateway site1 lan=") {
		t.Errorf("the job's map has no gateway record for site1's second host:\n%s", mp)
	}
	t.Logf("%d streams opened; %s", opened, lastLines(out, 30))
}
