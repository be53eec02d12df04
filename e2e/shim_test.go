package e2e

// End-to-end test of the shim (issue 5): unmodified Open MPI and MPICH jobs
// with ranks on two sites of an emulated grid, libmpi5k.so preloaded into the
// whole launcher tree, real gateways (bin/mpi5k-gateway) started from the
// lab's site map. Needs root, `make` (bin/mpi5k, bin/mpi5k-gateway,
// bin/libmpi5k.so) and the MPI apt packages.

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
	"github.com/mpi5k/mpi5k/trace"
)

// shimBins returns bin/libmpi5k.so and bin/mpi5k-gateway next to bin/mpi5k.
func shimBins(t *testing.T) (lib, gw string) {
	t.Helper()
	mpi5k, err := testbed.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(mpi5k)
	lib, gw = filepath.Join(dir, "libmpi5k.so"), filepath.Join(dir, "mpi5k-gateway")
	for _, p := range []string{lib, gw} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("need %s (run make): %v", p, err)
		}
	}
	return lib, gw
}

// startGateways runs one gateway per site inside its gateway host, with
// the default destination policy (only ports ranks listen on) and metrics
// on loopback port 9105, and waits until every one reports its WAN links
// up.
func startGateways(t *testing.T, l *testbed.Lab, gwBin string) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var cmds []*exec.Cmd
	t.Cleanup(func() {
		cancel()
		for _, c := range cmds {
			c.Wait()
		}
	})
	var ready []string
	for _, site := range l.Sites() {
		rf := filepath.Join(dir, site+".ready")
		logf, err := os.Create(filepath.Join(dir, site+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := l.CommandContext(ctx, "gw."+site, gwBin, "--map", l.SiteMapPath(), "--site", site, "--ready-file", rf, "--metrics", ":9105")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("gateway %s: %v", site, err)
		}
		cmds = append(cmds, cmd)
		ready = append(ready, rf)
		t.Cleanup(func() {
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("gateway %s log:\n%s", site, b)
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, rf := range ready {
		for {
			if _, err := os.Stat(rf); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway did not write %s within 30s", rf)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// shimTraceCheck decodes every trace file and checks the shim's decisions:
// each connection to another site's node went through the gateway (relayed
// or accepted with the true peer), none between nodes of one site did.
// Returns the counts of both kinds.
func shimTraceCheck(t *testing.T, dir string, m *sitemap.Map) (inter, intra int) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.trace"))
	if len(files) == 0 {
		t.Fatalf("no trace files in %s", dir)
	}
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		r, err := trace.NewReader(f)
		if err != nil {
			f.Close()
			t.Fatalf("%s: %v", path, err)
		}
		for {
			rec, err := r.Next()
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if rec.Kind != trace.KindConn {
				continue
			}
			ls, ok1 := m.Lookup(rec.Local.Addr())
			ps, ok2 := m.Lookup(rec.Peer.Addr())
			if !ok1 || !ok2 {
				continue // loopback (PMIx, orted) or unknown
			}
			if _, gw := m.GatewaySite(rec.Peer.Addr()); gw {
				t.Errorf("%s: a connection's true peer is a gateway: %+v", filepath.Base(path), rec)
				continue
			}
			through := rec.Flags&(trace.FlagRelayed|trace.FlagTruePeer) != 0
			if ls != ps {
				inter++
				if !through {
					t.Errorf("%s: inter-site connection %s -> %s not through the gateway", filepath.Base(path), rec.Local, rec.Peer)
				}
			} else {
				intra++
				if through {
					t.Errorf("%s: intra-site connection %s -> %s went through the gateway", filepath.Base(path), rec.Local, rec.Peer)
				}
			}
		}
		f.Close()
	}
	return inter, intra
}

// TestShimMPI: a ping-pong between the sites and an all-to-all, through real
// gateways, for both MPIs; no TCP byte on the WAN between other hosts than
// the gateways; and, from the traces, every inter-site connection relayed
// and every intra-site one direct.
func TestShimMPI(t *testing.T) {
	labRequireRoot(t)
	lib, gwBin := shimBins(t)
	l := labUp(t, testbed.Config{Nodes: 2, RTT: 10 * time.Millisecond, WANRate: 200e6})
	m, err := sitemap.Load(l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	startGateways(t, l, gwBin)
	sites := l.Sites()
	gwAddr := map[string]bool{}
	for _, s := range sites {
		gwAddr[l.Addr("gw."+s).String()] = true
	}
	// Open MPI: 4 ranks, 2 per site (inter- and intra-site rank traffic).
	// MPICH: 2 ranks, one per site: in this lab MPICH 4.0/UCX jobs of 3 or
	// more ranks hang at times even without the shim (seen under the load
	// of a shared 2-core machine), so its intra-site connections come from
	// hydra (proxy to mpiexec on the LAN address).
	hosts4 := "node-1.site1,node-2.site1,node-1.site2,node-2.site2"
	hosts2 := "node-1.site1,node-1.site2"
	shimEnv := []string{"LD_PRELOAD", "MPI5K_MAP", "GODEBUG", "MPI5K_TRACE"}
	cases := []struct {
		name, mpicc string
		tries       int
		cmd         func(bin string) []string
	}{
		{"openmpi", "mpicc.openmpi", 1, func(bin string) []string {
			argv := []string{"mpirun.openmpi", "--allow-run-as-root", "--mca", "plm_rsh_agent", "ssh",
				"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
				"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR,
				"-np", "4", "-H", hosts4}
			for _, e := range shimEnv {
				argv = append(argv, "-x", e)
			}
			return append(argv, bin)
		}},
		// MPICH 4.0/UCX often never leaves MPI_Finalize in this lab: rank 0
		// spins in UCX waiting for rank 1, which already sits in the PMI
		// barrier with unread bytes from rank 0 on its UCX socket. It is not
		// the shim: without it, 5 of 8 two-rank runs of this program hung the
		// same way (10 ms RTT, loaded 2-core machine). mpiJob runs a job that
		// hangs after its output is complete once more, then accepts it:
		// its output and the checks below are what this test is about.
		{"mpich", "mpicc.mpich", 2, func(bin string) []string {
			argv := []string{"mpiexec.mpich", "-launcher", "ssh", "-hosts", hosts2, "-n", "2",
				"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0"}
			for _, e := range shimEnv {
				argv = append(argv, "-genv", e, os.Getenv(e))
			}
			return append(argv, bin)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := shimBuildMPI(t, c.mpicc)
			traceDir := t.TempDir()
			os.Chmod(traceDir, 0o777)
			// -genv above reads these from this process's environment.
			for k, v := range map[string]string{"LD_PRELOAD": lib, "MPI5K_MAP": l.SiteMapPath(),
				"GODEBUG": "asyncpreemptoff=1", "MPI5K_TRACE": traceDir} {
				t.Setenv(k, v)
			}
			before, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			job := mpiJob{Host: "node-1.site1", Argv: c.cmd(bin), Dir: filepath.Dir(bin),
				Timeout: 90 * time.Second, Done: "shim_mpi ok", Tries: c.tries,
				AcceptHang: c.name == "mpich"}
			out := job.run(t, l)
			t.Logf("%s:\n%s", strings.Join(job.Argv, " "), out)
			after, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Every TCP byte on the WAN must be between the two gateways.
			for _, dir := range [][2]string{{sites[0], sites[1]}, {sites[1], sites[0]}} {
				viaGW, direct := shimWANBytes(after, dir, gwAddr)
				gw0, direct0 := shimWANBytes(before, dir, gwAddr)
				viaGW -= gw0
				direct -= direct0
				t.Logf("WAN %s->%s: %d TCP bytes between gateways, %d between other hosts", dir[0], dir[1], viaGW, direct)
				if direct != 0 {
					t.Errorf("WAN %s->%s: %d TCP bytes not between the gateways (direct inter-site flow)", dir[0], dir[1], direct)
				}
				// ping-pong 5 x (1 B + 1 KiB + 64 KiB + 1 MiB) each way, plus the all-to-all
				const payload = 5 * (1 + 1024 + 65536 + 1<<20)
				if viaGW < payload {
					t.Errorf("WAN %s->%s: only %d bytes between the gateways, want >= %d", dir[0], dir[1], viaGW, payload)
				}
			}
			if l := after.Link(sites[0], sites[1]); l != nil && l.OtherFlows != nil && l.OtherFlows.Bytes > 0 {
				t.Logf("note: %d bytes in flows beyond the per-link flow table", l.OtherFlows.Bytes)
			}
			inter, intra := shimTraceCheck(t, traceDir, m)
			t.Logf("traced connections between nodes: %d inter-site (through the gateways), %d intra-site (direct)", inter, intra)
			if inter == 0 || intra == 0 {
				t.Errorf("want both inter-site and intra-site connections in the traces, got %d and %d", inter, intra)
			}
		})
	}

	// The gateways run the default destination policy: the jobs reached
	// their ranks' registered ports and nothing was refused; a service of
	// a site host that is no rank's is refused and counted.
	const refusals = `mpi5k_refusals_total{reason="dst_port"}`
	for _, s := range sites {
		if n := gwMetric(t, l, s, refusals); n != 0 {
			t.Errorf("the gateway of %s refused %v streams of the MPI jobs (dst_port)", s, n)
		}
		if n := gwMetric(t, l, s, "mpi5k_rank_listeners"); n != 0 {
			t.Errorf("the gateway of %s keeps %v ranks' ports registered after the jobs ended", s, n)
		}
	}
	ctx := context.Background()
	sink := netip.AddrPortFrom(l.Addr("node-1."+sites[1]), 7001).String()
	startServer(t, ctx, l, "node-1."+sites[1], "sink", sink)
	site1, _ := m.Site(sites[0])
	if out, err := helper(t, ctx, l, "node-1."+sites[0], "send", sink, site1.LAN.String(), "1").Output(); err == nil {
		t.Errorf("a stream to %s, a service no rank registered, went through: %s", sink, out)
	}
	if n := gwMetric(t, l, sites[1], refusals); n != 1 {
		t.Errorf("the gateway of %s counted %v dst_port refusals, want 1", sites[1], n)
	}
}

// gwMetric reads one sample of the /metrics of the gateway of site (on
// loopback port 9105 of its host), given as the line's text before the
// value (`mpi5k_refusals_total{reason="dst_port"}`); 0 if absent.
func gwMetric(t *testing.T, l *testbed.Lab, site, sample string) float64 {
	t.Helper()
	out, err := helper(t, context.Background(), l, l.Gateway(site), "get", "http://127.0.0.1:9105/metrics").Output()
	if err != nil {
		t.Fatalf("metrics of the gateway of %s: %v", site, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(dropSite(line), sample+" "); ok {
			x, _ := strconv.ParseFloat(v, 64)
			return x
		}
	}
	return 0
}

// shimWANBytes sums TCP bytes on one WAN direction: between gateway
// addresses, and between any other addresses.
func shimWANBytes(s testbed.Stats, dir [2]string, gw map[string]bool) (viaGW, direct uint64) {
	ls := s.Link(dir[0], dir[1])
	if ls == nil {
		return 0, 0
	}
	host := func(ap string) string {
		if a, err := netip.ParseAddrPort(ap); err == nil {
			return a.Addr().String()
		}
		return ap
	}
	for _, f := range ls.Flows {
		if f.Proto != "tcp" {
			continue
		}
		if gw[host(f.Src)] && gw[host(f.Dst)] {
			viaGW += f.Bytes
		} else {
			direct += f.Bytes
		}
	}
	return viaGW, direct
}

func shimBuildMPI(t *testing.T, mpicc string) string {
	t.Helper()
	return buildMPI(t, mpicc, "shim_mpi")
}

// buildMPI compiles testdata/NAME.c with mpicc into the test's directory.
func buildMPI(t *testing.T, mpicc, name string) string {
	t.Helper()
	if _, err := exec.LookPath(mpicc); err != nil {
		t.Fatalf("%s not installed: %v", mpicc, err)
	}
	src, err := filepath.Abs("testdata/" + name + ".c")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	if b, err := exec.Command(mpicc, "-O2", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mpicc, err, b)
	}
	return out
}

// TestShimConnectLatency: connect() to another site costs a WAN round trip
// direct, but only a LAN round trip (to the gateway) through the shim; a
// refused destination comes back as a reset. Also prints the figures of
// docs/shim.md for the lab.
func TestShimConnectLatency(t *testing.T) {
	labRequireRoot(t)
	lib, gwBin := shimBins(t)
	if _, err := exec.LookPath("socat"); err != nil {
		t.Fatalf("socat not installed (scripts/deps.sh): %v", err)
	}
	const rtt = 20 * time.Millisecond
	l := labUp(t, testbed.Config{Nodes: 1, RTT: rtt, WANRate: 200e6})
	startGateways(t, l, gwBin)
	prog := filepath.Join(t.TempDir(), "shimtest")
	src, _ := filepath.Abs("../shim/test/c/shimtest.c")
	if b, err := exec.Command("cc", "-O2", "-o", prog, src, "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, b)
	}
	dst := l.Addr("node-1.site2").String()
	ctx, cancel := context.WithCancel(context.Background())
	echo := l.CommandContext(ctx, "node-1.site2", "socat", "TCP-LISTEN:7777,bind="+dst+",fork,reuseaddr", "PIPE")
	if err := echo.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); echo.Wait() }()
	time.Sleep(300 * time.Millisecond)
	srcAddr := l.Addr("node-1.site1").String()
	bench := func(env ...string) (mean, min float64) {
		argv := append(append([]string{"env"}, env...), prog, "bench-connect", "20", srcAddr, dst, "7777")
		out, err := l.Command("node-1.site1", argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("bench-connect %v: %v\n%s", env, err, out)
		}
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "connect us/op mean=%f min=%f", &mean, &min); err != nil {
			t.Fatalf("bench-connect output %q: %v", out, err)
		}
		return mean, min
	}
	dMean, dMin := bench()
	rMean, rMin := bench("LD_PRELOAD="+lib, "MPI5K_MAP="+l.SiteMapPath(), "GODEBUG=asyncpreemptoff=1")
	t.Logf("connect() to another site, RTT %v: direct mean %.0f us min %.0f us; through the shim mean %.0f us min %.0f us",
		rtt, dMean, dMin, rMean, rMin)
	if dMin < 0.9*float64(rtt.Microseconds()) {
		t.Errorf("direct connect took %.0f us, less than the WAN RTT: the WAN emulation is not in the path", dMin)
	}
	if rMin > float64(rtt.Microseconds())/4 {
		t.Errorf("relayed connect took %.0f us: a WAN round trip inside connect()", rMin)
	}
	// A destination that refuses surfaces as a reset or EOF, never a hang.
	out, err := l.Command("node-1.site1", "env", "LD_PRELOAD="+lib, "MPI5K_MAP="+l.SiteMapPath(), "GODEBUG=asyncpreemptoff=1",
		prog, "refused", srcAddr, dst, "7778").CombinedOutput()
	t.Logf("refused destination: %s", strings.TrimSpace(string(out)))
	if err != nil || !strings.Contains(string(out), "refused ok") {
		t.Errorf("refused destination through the gateways: %v\n%s", err, out)
	}
}
