package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
	"github.com/mpi5k/mpi5k/trace"
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

// TestWrapTraceCollect: `mpi5k run --trace DIR` without --shared-fs
// creates DIR on the rank hosts and brings every rank's trace back; the
// collected files decode.
func TestWrapTraceCollect(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "trc" + itoa4(), Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte(m.hostfile), 0o644)
	traces := filepath.Join(dir, "traces", "new") // made by the run
	argv := append([]string{wrapScript(t), "--trace", traces, "--workdir", filepath.Join(dir, "work")}, m.argv(bin, hf, "1")...)
	out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 90 * time.Second, Done: "chaos_mpi ok"}.run(t, l)
	t.Logf("%s", lastLines(out, 3))
	if !strings.Contains(out, "trace files from 2 hosts in "+traces) {
		t.Errorf("no collection line:\n%s", out)
	}
	files, _ := filepath.Glob(filepath.Join(traces, "*.trace"))
	if len(files) < 2 {
		t.Fatalf("%d trace files in %s, want one per rank at least", len(files), traces)
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trace.NewReader(fh); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		fh.Close()
	}
	if left, _ := filepath.Glob(filepath.Join(traces, ".collect-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestWrapDegradedSummary: gateways put on node hosts (whose
// net.ipv4.tcp_slow_start_after_idle the lab leaves at 1, unlike its
// gateway hosts) run without keep-warm, and the job's summary says so in
// one line.
func TestWrapDegradedSummary(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "dgr" + itoa4(), Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte(m.hostfile), 0o644)
	run := func(gw ...string) string {
		argv := append(append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, "w"+gw[0])}, gw...), m.argv(bin, hf, "1")...)
		return mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 90 * time.Second, Done: "chaos_mpi ok"}.run(t, l)
	}
	out := run("--gateway", "site1=node-1.site1", "--gateway", "site2=node-1.site2")
	want := "  degraded: site1, site2: express link not kept warm: net.ipv4.tcp_slow_start_after_idle is not 0 on the gateway host"
	if n := strings.Count(out, "degraded:"); n != 1 || !strings.Contains(out, want) {
		t.Errorf("summary with gateways on node hosts: %d degraded lines, want 1 with %q:\n%s", n, want, out)
	}
	// On the lab's gateway hosts (sysctl 0) the line names no keep-warm.
	out = run("--gateway", "site1=gw.site1", "--gateway", "site2=gw.site2")
	if strings.Contains(out, "not kept warm") {
		t.Errorf("gateways on warm hosts reported as not warm:\n%s", out)
	}
	t.Logf("%s", lastLines(out, 4))
}

// TestWrapUnprivilegedGateways: gateways run as an unprivileged user (a
// launcher that drops to nobody with setpriv) still carry a verified job,
// and the one summary line names the congestion controls this host's
// net.ipv4.tcp_allowed_congestion_control kept from them.
func TestWrapUnprivilegedGateways(t *testing.T) {
	labRequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	allowed := strings.Fields(string(b))
	l := labUp(t, testbed.Config{Name: "unp" + itoa4(), Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	dir := t.TempDir()
	os.Chmod(dir, 0o755) // nobody reads the map under it
	os.Chmod(filepath.Dir(dir), 0o755)
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte(m.hostfile), 0o644)
	launcher := filepath.Join(dir, "ssh-nobody")
	os.WriteFile(launcher, []byte("#!/bin/sh\nhost=$1; shift\nexec ssh \"$host\" setpriv --reuid=65534 --regid=65534 --clear-groups -- \"$@\"\n"), 0o755)
	work := filepath.Join(dir, "work")
	argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", work, "--launcher", launcher}, m.argv(bin, hf, "1")...)
	out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 90 * time.Second, Done: "chaos_mpi ok"}.run(t, l)
	t.Logf("allowed without CAP_NET_ADMIN: %v\n%s", allowed, lastLines(out, 3))
	for cc, what := range map[string]string{"bbr": "bulk WAN links on the default congestion control, not BBR", "cubic": "express link not on CUBIC"} {
		if want := !slices.Contains(allowed, cc); strings.Contains(out, what) != want {
			t.Errorf("%s allowed: %v; the summary names %q: %v, want %v:\n%s", cc, !want, what, !want, want, out)
		}
	}
	if n := strings.Count(out, "degraded:"); n > 1 {
		t.Errorf("%d degraded lines, want at most 1:\n%s", n, out)
	}
}
