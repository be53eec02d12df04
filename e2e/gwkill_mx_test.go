package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestMXGatewayHostKilled: with the MX LAN transport and two gateway
// hosts per site (lab up --gateways 2), one of the launching site's
// gateways is SIGKILLed while an MPI job that checks every message runs
// through both. The connection it carried moves to the other gateway
// (the node daemons' resumable connections, docs/failures.md): the job
// ends with every payload intact and exit status 0. Four ranks, two per
// site: the launching site's node daemon opens the job's two inter-site
// connections, one through each of its gateways (as in
// TestMXTwoGatewaysPerSite), so the killed one carried one of them, which
// the node daemons' logs confirm.
func TestMXGatewayHostKilled(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "mxk" + itoa4(), Nodes: 1, Gateways: 2, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte("node-1.site1 slots=2\nnode-1.site2 slots=2\n"), 0o644)
	job := m.argv(bin, hf, "30")
	job = append([]string{job[0], "--map-by", "node"}, job[1:]...)
	for i := range job {
		if job[i] == "-np" {
			job[i+1] = "4"
		}
	}
	work := filepath.Join(dir, "w")
	argv := append([]string{wrapScript(t), "--shared-fs", "--keep", "--workdir", work, "--lan-transport", "mx", "--lan-if", "eth0"}, job...)
	w := (&wrappedJob{out: &lockedBuffer{}, exited: make(chan struct{}), work: work, hf: hf}).start(t, l, dir, argv)
	if !w.waitFor("chaos_mpi running", 60*time.Second) {
		t.Fatalf("job did not start:\n%s", w.out.String())
	}
	time.Sleep(2 * time.Second)
	pids := sitePids(t, work, "site1")
	if len(pids) != 2 {
		t.Fatalf("%d gateway processes of site1, want 2", len(pids))
	}
	killed := time.Now()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !w.waitExit(120 * time.Second) {
		t.Fatalf("the job still runs 120 s after a gateway was killed:\n%s", w.out.String())
	}
	out := w.out.String()
	t.Logf("ended %v after the kill:\n%s", w.end.Sub(killed).Round(time.Millisecond), lastLines(out, 30))
	if code := w.cmd.ProcessState.ExitCode(); code != 0 || !regexp.MustCompile(`chaos_mpi ok \d+`).MatchString(out) {
		t.Errorf("exit status %d, want 0 and every payload intact (chaos_mpi ok):\n%s", code, out)
	}
	// The connection through the killed gateway moved: a node daemon
	// says so.
	logs, _ := filepath.Glob(filepath.Join(work, "*node*"))
	moved := 0
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		moved += strings.Count(string(b), "carried on by a new stream")
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "resumable connection") {
				t.Logf("%s: %s", filepath.Base(f), line)
			}
		}
	}
	if moved == 0 {
		t.Errorf("no node daemon log among %v says a connection moved to another gateway", logs)
	}
	t.Logf("%d connections moved", moved)
}

// sitePids lists the gateway processes of site for the job whose work
// directory is work.
func sitePids(t *testing.T, work, site string) []int {
	t.Helper()
	_, gwBin := shimBins(t)
	var pids []int
	for _, p := range processesWith(work + "/sites.conf") {
		pid, cl, _ := strings.Cut(p, ": ")
		if strings.HasPrefix(cl, gwBin+" ") && strings.Contains(cl, "--site "+site+" ") {
			var n int
			fmt.Sscan(pid, &n)
			pids = append(pids, n)
		}
	}
	return pids
}
