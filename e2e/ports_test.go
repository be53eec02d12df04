package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
)

// TestWrapConcurrentRuns: two `mpi5k run` jobs at once on the same hosts,
// with the same gateway hosts, an Open MPI and an MPICH one: each draws its
// own gateway ports, so both run and verify their payloads.
func TestWrapConcurrentRuns(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "ports" + itoa4(), Nodes: 1, RTT: 10 * time.Millisecond, WANRate: 100e6})
	dir := t.TempDir()
	var jobs []*wrappedJob
	for _, m := range chaosMPIs {
		jobs = append(jobs, startWrapped(t, l, m, buildMPI(t, m.mpicc, "chaos_mpi"), dir, m.name, "8"))
	}
	for i, w := range jobs {
		if !w.waitFor("chaos_mpi running", 60*time.Second) {
			t.Fatalf("%s job did not start:\n%s", chaosMPIs[i].name, w.out.String())
		}
	}
	// Both run now: their maps name different ports.
	var lan []uint16
	for _, w := range jobs {
		m, err := sitemap.Load(filepath.Join(w.work, "sites.conf"))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := m.Site("site1")
		lan = append(lan, s.LAN.Port())
	}
	t.Logf("LAN ports of the two jobs' gateways: %v", lan)
	if lan[0] == lan[1] {
		t.Errorf("both jobs' gateways listen on %d", lan[0])
	}
	for i, w := range jobs {
		w.finish(t, chaosMPIs[i], 90*time.Second)
	}
}

func itoa4() string { return string(rune('a'+os.Getpid()%26)) + string(rune('a'+os.Getpid()/26%26)) }
