package gateway

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// BenchmarkMultiGatewayCPU measures a site pair's WAN rate with 1, 2 and 4
// gateway hosts per site when each gateway process may use only a slice
// of a core: every gateway runs in a cgroup of its own whose CPU quota is
// MPI5K_GW_CPU percent of a core (default 10), on loopback. Streams
// parallel checksummed bulk streams (MPI5K_MULTI_STREAMS, default 8, of
// MPI5K_MULTI_MB MiB each, default 32) go from site a to site b, stream i
// opened at gateway i mod N of site a (as the shim spreads them); the
// gateway counts run alternated (1, 2, 4, 1, 2, 4, ...) for
// MPI5K_MULTI_ROUNDS rounds (default 3). It reports the min and median
// rate per count and the gateways' CPU (sum over the site pair's
// processes, in cores). Needs root (cgroups); skipped otherwise.
//
//	flock /tmp/mpi5k-heavy.lock go test -run '^$' -bench MultiGatewayCPU -benchtime 1x -v ./gateway
func BenchmarkMultiGatewayCPU(b *testing.B) {
	cg, err := newCPUCgroups(b)
	if err != nil {
		b.Skipf("no CPU cgroup: %v", err)
	}
	pct := envInt("MPI5K_GW_CPU", 10)
	streams := envInt("MPI5K_MULTI_STREAMS", 8)
	size := envInt("MPI5K_MULTI_MB", 32) << 20
	rounds := envInt("MPI5K_MULTI_ROUNDS", 3)
	counts := []int{1, 2, 4}
	rate := map[int][]float64{}
	cpu := map[int][]float64{}
	for round := range rounds {
		for _, n := range counts {
			r, c := runMultiCPU(b, cg, n, pct, streams, size)
			b.Logf("round %d, %d gateway(s) per site: %.0f Mbit/s, gateways' CPU %.2f cores", round+1, n, r, c)
			rate[n] = append(rate[n], r)
			cpu[n] = append(cpu[n], c)
		}
	}
	for _, n := range counts {
		slices.Sort(rate[n])
		slices.Sort(cpu[n])
		b.ReportMetric(rate[n][0], fmt.Sprintf("Mbit/s-min-%dgw", n))
		b.ReportMetric(rate[n][len(rate[n])/2], fmt.Sprintf("Mbit/s-med-%dgw", n))
		b.ReportMetric(cpu[n][len(cpu[n])/2], fmt.Sprintf("cores-med-%dgw", n))
	}
	b.Logf("cgroup %s, quota %d %% of a core per gateway process, %d streams of %d MiB", cg.kind, pct, streams, size>>20)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// runMultiCPU runs one measurement with n gateways per site, each capped
// at pct % of a core; it returns the rate (Mbit/s of application bytes)
// and the gateways' CPU time over the transfer (cores).
func runMultiCPU(b *testing.B, cg *cpuCgroups, n, pct, streams, size int) (float64, float64) {
	m := multiMap(b, n)
	dir := b.TempDir()
	mp := filepath.Join(dir, "sites.conf")
	if err := os.WriteFile(mp, []byte(m.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	var procs []*exec.Cmd
	for _, s := range m.Sites() {
		for i, gw := range s.Gateways {
			c := startGatewayChild(b, mp, dir, s.Name, i, gw)
			if err := cg.add(c.Process.Pid, pct); err != nil {
				b.Fatal(err)
			}
			procs = append(procs, c)
		}
	}
	waitReadyFiles(b, dir, len(procs))
	a, _ := m.Site("a")
	dst := testnet.Serve(b, nodeB, testnet.SumServer)
	cpu0 := make([]time.Duration, len(procs))
	for i, p := range procs {
		cpu0[i] = cpuTime(p.Process.Pid)
	}
	var next atomic.Int64
	start := time.Now()
	total, errs := testnet.Streams(streams, 5, func(*rand.Rand) int { return size },
		func() (*net.TCPConn, func() string, error) {
			gw := a.Gateways[int(next.Add(1)-1)%n]
			c, err := lanOpen(gw.LAN, nodeA, dst)
			return c, nil, err
		})
	el := time.Since(start)
	var used time.Duration
	for i, p := range procs {
		used += cpuTime(p.Process.Pid) - cpu0[i]
	}
	for _, err := range errs {
		b.Fatal(err)
	}
	for _, p := range procs { // not at the benchmark's end: idle gateways would share the cores
		p.Process.Signal(syscall.SIGTERM)
		p.Wait()
	}
	return float64(total) * 8 / el.Seconds() / 1e6, used.Seconds() / el.Seconds()
}

// cpuCgroups makes one CPU cgroup per gateway process under a directory of
// its own, removed when the benchmark ends: cgroup v2 (cpu.max) when the
// unified hierarchy has the cpu controller, else v1 (cpu.cfs_quota_us).
type cpuCgroups struct {
	b    testing.TB
	kind string // "v2" or "v1"
	root string
	n    int
}

func newCPUCgroups(b testing.TB) (*cpuCgroups, error) {
	cg := &cpuCgroups{b: b}
	if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(ctl)), "cpu") {
		cg.kind, cg.root = "v2", "/sys/fs/cgroup"
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		cg.kind, cg.root = "v1", "/sys/fs/cgroup/cpu"
	} else {
		return nil, fmt.Errorf("neither /sys/fs/cgroup/cgroup.controllers with cpu nor /sys/fs/cgroup/cpu")
	}
	dir := filepath.Join(cg.root, fmt.Sprintf("mpi5k-multigw-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if cg.kind == "v2" {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
			os.Remove(dir)
			return nil, err
		}
	}
	cg.root = dir
	// Registered before any gateway starts, so it runs after their
	// cleanups have stopped them (cleanups run last first).
	b.Cleanup(func() {
		subs, _ := filepath.Glob(filepath.Join(dir, "gw-*"))
		for _, s := range subs {
			for i := 0; os.Remove(s) != nil && i < 100; i++ {
				time.Sleep(20 * time.Millisecond) // its process is still exiting
			}
		}
		if err := os.Remove(dir); err != nil {
			b.Errorf("cgroup %s not removed: %v", dir, err)
		}
	})
	return cg, nil
}

// add puts process pid in a new cgroup limited to pct % of a core.
func (cg *cpuCgroups) add(pid, pct int) error {
	cg.n++
	dir := filepath.Join(cg.root, fmt.Sprintf("gw-%d", cg.n))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	const period = 100000 // µs
	quota := period * pct / 100
	var err error
	if cg.kind == "v2" {
		err = os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, period)), 0o644)
	} else {
		if err = os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0o644); err == nil {
			err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0o644)
		}
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
	}
	return err
}
