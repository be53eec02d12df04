package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestWrapTwoGatewaysPerSite: on a lab of two gateway hosts per site
// (lab up --gateways 2: gw and gw2), `mpi5k run` takes them from the lab's
// $MPI5K_GATEWAYS without flags and starts a gateway on each; the four
// form a mesh of four gateway pairs, and an MPI job runs through them;
// the summary reports every gateway and its links to both gateways of
// the other site. Then a gateway that carries none of a running job's
// streams is killed (SIGKILL): the job goes on through the others and
// completes, and the wrapper says which gateway died.
func TestWrapTwoGatewaysPerSite(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: "gw2", Nodes: 1, Gateways: 2, RTT: 5 * time.Millisecond, WANRate: 100e6})
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	t.Run("mesh", func(t *testing.T) {
		dir := t.TempDir()
		hf := filepath.Join(dir, "hosts")
		os.WriteFile(hf, []byte(m.hostfile), 0o644)
		argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, "w")}, m.argv(bin, hf, "2")...)
		out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 120 * time.Second, Done: "chaos_mpi ok"}.run(t, l)
		checkFourGatewayPairs(t, out, "gw2")
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
	})
	t.Run("one-dies", func(t *testing.T) {
		w := startRunning(t, l, m, bin, t.TempDir(), "dies", "12")
		time.Sleep(time.Second)
		host, pid := idleGateway(t, l, w.work)
		site := l.SiteOf(host)
		label := site // the summary's name of the gateway: its site, with its host when it is not the first
		if host != l.Gateway(site) {
			label += "@" + host
		}
		t.Logf("killing the gateway on %s (pid %d), which carries none of the job's streams", host, pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		told := fmt.Sprintf("mpi5k: site %s: the gateway on %s exited during the job", site, host)
		if !w.waitFor(told, 10*time.Second) {
			t.Errorf("no line %q within 10 s of the kill:\n%s", told, w.out.String())
		}
		w.finish(t, m, 60*time.Second)
		out := w.out.String()
		for _, want := range []string{
			told, "the ranks' connections through it are reset, new ones go to the site's 1 other gateway; the job goes on",
			fmt.Sprintf("  died during the job: %s (host %s, site %s) exited during the job", label, host, site),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, lastLines(out, 30))
			}
		}
		t.Logf("%s", lastLines(out, 30))
	})
}

// idleGateway finds a gateway of the run with workdir work whose /metrics
// counts no stream opened, and its process: host and pid.
func idleGateway(t *testing.T, l *testbed.Lab, work string) (string, int) {
	t.Helper()
	_, gwBin := shimBins(t)
	metricsRE := regexp.MustCompile(` --metrics (\S+) `)
	var seen []string
	for _, p := range processesWith(work + "/sites.conf") {
		pids, cl, _ := strings.Cut(p, ": ")
		mm := metricsRE.FindStringSubmatch(cl)
		if !strings.HasPrefix(cl, gwBin+" ") || mm == nil {
			continue
		}
		host := ""
		for _, site := range l.Sites() {
			for _, h := range l.Gateways(site) {
				if strings.HasPrefix(mm[1], l.Addr(h).String()+":") {
					host = h
				}
			}
		}
		if host == "" {
			continue
		}
		text, err := helper(t, context.Background(), l, host, "get", "http://"+mm[1]+"/metrics").Output()
		if err != nil {
			t.Fatalf("metrics of the gateway on %s: %v", host, err)
		}
		n := metricSum(string(text), "mpi5k_streams_opened_total")
		seen = append(seen, fmt.Sprintf("%s: %.0f streams", host, n))
		if n == 0 {
			pid, _ := strconv.Atoi(pids)
			return host, pid
		}
	}
	t.Fatalf("no gateway of the job without streams: %v", seen)
	return "", 0
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
			checkFourGatewayPairs(t, out, "node-2")
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
// two gateways each (gw and second, e.g. node-2 or gw2) has a line for
// every gateway's link to each gateway of the other site.
func checkFourGatewayPairs(t *testing.T, out, second string) {
	t.Helper()
	s1, s2 := "site1@"+second+".site1", "site2@"+second+".site2"
	for _, want := range []string{
		"site1 -> site2:", "site1 -> site2/1:", s1 + " -> site2:", s1 + " -> site2/1:",
		"site2 -> site1:", "site2 -> site1/1:", s2 + " -> site1:", s2 + " -> site1/1:",
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
