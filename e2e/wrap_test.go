package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// wrapScript is scripts/mpirun-wrap of this checkout.
func wrapScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../scripts/mpirun-wrap")
	if err != nil {
		t.Fatal(err)
	}
	shimBins(t) // the wrapper needs bin/libmpi5k.so and bin/mpi5k-gateway
	return p
}

// wrapNodeBytes sums TCP bytes of one WAN direction between two compute
// nodes (neither a gateway): traffic that bypassed the gateways.
func wrapNodeBytes(s testbed.Stats, from, to string, nodes map[string]bool) uint64 {
	ls := s.Link(from, to)
	if ls == nil {
		return 0
	}
	var n uint64
	for _, f := range ls.Flows {
		src, err1 := netip.ParseAddrPort(f.Src)
		dst, err2 := netip.ParseAddrPort(f.Dst)
		if f.Proto == "tcp" && err1 == nil && err2 == nil && nodes[src.Addr().String()] && nodes[dst.Addr().String()] {
			n += f.Bytes
		}
	}
	return n
}

// processesWith lists processes whose command line mentions marker.
func processesWith(marker string) []string {
	var out []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || labZombie(p.Name()) {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, marker) && !strings.Contains(cl, "go test") {
			out = append(out, p.Name()+": "+cl)
		}
	}
	return out
}

// waitGone waits until no process mentions marker.
func waitGone(t *testing.T, marker string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := processesWith(marker)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("still running %v after the wrapper ended:\n%s", d, strings.Join(left, "\n"))
			for _, l := range left {
				var pid int
				fmt.Sscan(l, &pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWrapMPI: scripts/mpirun-wrap in front of unmodified Open MPI and MPICH
// command lines runs a 4-rank job (2 sites x 2 nodes) through the gateways:
// the job is correct, every inter-site byte crossed the WAN between the
// gateways, the summary reports it, and nothing is left running.
func TestWrapMPI(t *testing.T) {
	labRequireRoot(t)
	wrap := wrapScript(t)
	l := labUp(t, testbed.Config{Nodes: 2, RTT: 10 * time.Millisecond, WANRate: 200e6})
	nodes := map[string]bool{}
	for _, h := range l.Hosts("", false) {
		nodes[l.Addr(h).String()] = true
	}
	dir := t.TempDir()
	// MPICH 4.0 / UCX 1.13 often never leaves MPI_Finalize over its tcp
	// transport, with or without mpi5k (openucx/ucx#8738: tcp stops
	// progressing too early during cleanup; 5 of 8 direct 2-rank runs hung
	// here). For MPICH a run whose job output is complete and verified but
	// which does not exit within 30 s is interrupted with SIGINT (the
	// wrapper's own cleanup path, checked below like a clean exit) and
	// accepted, logged; for Open MPI it is a failure.
	cases := []struct {
		name, mpicc, hostfile string
		finalizeMayHang       bool
		cmd                   func(bin, hf string) []string
	}{
		{"openmpi", "mpicc.openmpi", "node-1.site1 slots=1\nnode-2.site1 slots=1\nnode-1.site2 slots=1\nnode-2.site2 slots=1\n", false,
			func(bin, hf string) []string {
				return []string{"mpirun.openmpi", "--allow-run-as-root", "-np", "4", "--hostfile", hf,
					"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
					"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR, bin}
			}},
		{"mpich", "mpicc.mpich", "node-1.site1:1\nnode-2.site1:1\nnode-1.site2:1\nnode-2.site2:1\n", true,
			func(bin, hf string) []string {
				return []string{"mpiexec.mpich", "-launcher", "ssh", "-f", hf, "-n", "4",
					"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0", bin}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := shimBuildMPI(t, c.mpicc)
			hf := filepath.Join(dir, c.name+".hosts")
			if err := os.WriteFile(hf, []byte(c.hostfile), 0o644); err != nil {
				t.Fatal(err)
			}
			before, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			work := filepath.Join(dir, c.name+".work")
			sumJSON := filepath.Join(dir, c.name+".summary.json")
			argv := append([]string{wrap, "--shared-fs", "--workdir", work, "--wan-cc", "cubic", "--summary-json", sumJSON}, c.cmd(bin, hf)...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := l.CommandContext(ctx, "node-1.site1", argv[0], argv[1:]...)
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
			cmd.WaitDelay = 20 * time.Second
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			text := string(out)
			t.Logf("%s\n%s", strings.Join(argv, " "), out)
			hung := false // the launcher was interrupted after a verified job
			switch {
			case ctx.Err() == context.DeadlineExceeded && c.finalizeMayHang && strings.Contains(text, "shim_mpi ok"):
				hung = true
				t.Logf("job verified but mpiexec did not exit within 30s (MPI_Finalize hang, openucx/ucx#8738); interrupted")
			case ctx.Err() == context.DeadlineExceeded:
				t.Fatalf("wrapped %s did not finish within 30s", c.name)
			case err != nil:
				t.Fatalf("wrapped %s failed: %v", c.name, err)
			}
			if !strings.Contains(text, "shim_mpi ok") {
				t.Errorf("the job did not report success")
			}
			// The summary names both directions with bytes and opened streams.
			re := regexp.MustCompile(`site1 -> site2: ([0-9.]+) (KiB|MiB) sent, .* ([1-9][0-9]*) streams opened`)
			if !re.MatchString(text) {
				t.Errorf("summary lacks site1 -> site2 traffic")
			}
			// --summary-json holds the same, for programs; its launcher
			// status is 0, but for a launcher interrupted after a finalize
			// hang: that one exits as it likes (0 or 2 seen), and the
			// wrapper reports what it exited with.
			var sum struct {
				Gateways []struct {
					Site  string
					Peers []struct {
						Peer          string
						BytesSent     float64 `json:"bytes_sent"`
						StreamsOpened float64 `json:"streams_opened"`
					}
					CPU float64 `json:"cpu_s"`
				}
				LauncherStatus int `json:"launcher_status"`
			}
			if b, err := os.ReadFile(sumJSON); err != nil {
				t.Errorf("--summary-json: %v", err)
			} else if err := json.Unmarshal(b, &sum); err != nil {
				t.Errorf("--summary-json: %v\n%s", err, b)
			} else if len(sum.Gateways) != 2 || sum.Gateways[0].Site != "site1" || len(sum.Gateways[0].Peers) != 1 ||
				sum.Gateways[0].Peers[0].Peer != "site2" || sum.Gateways[0].Peers[0].BytesSent < 1<<20 || sum.Gateways[0].Peers[0].StreamsOpened < 1 ||
				sum.LauncherStatus != 0 && !hung {
				t.Errorf("--summary-json:\n%s", b)
			}
			after, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Only the ranks are preloaded: the launcher's own control
			// connections (orted -> mpirun, hydra proxy -> mpiexec) stay
			// direct and carry a few KiB. The job's MPI data (5 x 1 MiB
			// ping-pongs alone) must all go between the gateways.
			gws := map[string]bool{}
			for _, h := range l.Hosts("", true) {
				if !nodes[l.Addr(h).String()] {
					gws[l.Addr(h).String()] = true
				}
			}
			for _, d := range [][2]string{{"site1", "site2"}, {"site2", "site1"}} {
				direct := wrapNodeBytes(after, d[0], d[1], nodes) - wrapNodeBytes(before, d[0], d[1], nodes)
				viaA, _ := shimWANBytes(after, d, gws)
				viaB, _ := shimWANBytes(before, d, gws)
				t.Logf("%s -> %s: %d bytes between gateways, %d node to node (launcher control)", d[0], d[1], viaA-viaB, direct)
				if direct > 64<<10 {
					t.Errorf("%d bytes went node to node %s -> %s, bypassing the gateways", direct, d[0], d[1])
				}
				if viaA-viaB < 5<<20 {
					t.Errorf("only %d bytes crossed %s -> %s between the gateways, want >= 5 MiB", viaA-viaB, d[0], d[1])
				}
			}
			if _, err := os.Stat(work); err == nil {
				t.Errorf("workdir %s left after the run", work)
			}
			waitGone(t, work+"/sites.conf", 5*time.Second)
		})
	}
}

// TestWrapBadInput: each mistake is one clear line, a non-zero exit, and no
// gateway left running.
func TestWrapBadInput(t *testing.T) {
	labRequireRoot(t)
	wrap := wrapScript(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6})
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.hosts", "node-1.site1\nnode-1.site2\n", 0o644)
	// A gateway that starts but never reaches its peer (it never serves
	// /ready); its name marks its processes.
	never := write("never-ready-gw", "#!/bin/sh\nexec sleep 300\n", 0o755)
	sites := write("sites", "node-1.site1 site1\n", 0o644)
	cases := []struct {
		name  string
		flags []string
		hosts string
		want  string
	}{
		{"unknown host", nil, write("unknown.hosts", "node-1.site1\nnode-7.site2\n", 0o644), "cannot resolve host node-7.site2"},
		{"host in no site", []string{"--sites", sites}, good, "host node-1.site2 (10.77.2.11) is in no site"},
		{"not a Grid'5000 name", nil, write("bare.hosts", "node-1.site1\ngw.site2\n", 0o644), "host gw.site2 is in no site"},
		{"gateway never ready", []string{"--gateway-bin", never, "--ready-timeout", "3s"}, good, "gateways not ready after 3s: site site1"},
		{"missing gateway binary", []string{"--gateway-bin", filepath.Join(dir, "nope")}, good, "nope: no such file"},
		{"missing mpirun", nil, good, "mpirun.nosuch: not found"},
		{"bad wan-cc", []string{"--wan-cc", "nosuchcc"}, good, `invalid argument "nosuchcc" for "--wan-cc" flag`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			work := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".work")
			launcher := "mpirun.openmpi"
			if c.name == "missing mpirun" {
				launcher = "mpirun.nosuch"
			}
			argv := append([]string{wrap, "--shared-fs", "--workdir", work, "--flavour", "openmpi"}, c.flags...)
			argv = append(argv, launcher, "--allow-run-as-root", "-np", "2", "--hostfile", c.hosts, "true")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := l.CommandContext(ctx, "node-1.site1", argv[0], argv[1:]...)
			out, err := cmd.CombinedOutput()
			text := strings.TrimSpace(string(out))
			t.Logf("%s", text)
			if err == nil {
				t.Fatalf("exit status 0, want an error")
			}
			if !strings.Contains(text, c.want) {
				t.Errorf("error does not say %q", c.want)
			}
			if !strings.HasPrefix(text, "mpi5k run: ") {
				t.Errorf("error is not the wrapper's one line: %q", text)
			}
			waitGone(t, work+"/sites.conf", 5*time.Second)
			waitGone(t, "never-ready-gw", 5*time.Second)
		})
	}
}

// TestWrapSIGINT: interrupting the wrapper mid-run stops the ranks and the
// gateways.
func TestWrapSIGINT(t *testing.T) {
	labRequireRoot(t)
	wrap := wrapScript(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6})
	dir := t.TempDir()
	hf := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hf, []byte("node-1.site1\nnode-1.site2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The "ranks" sleep for an odd duration the test can find them by (the
	// wrapper's own command line names the script, not the sleep).
	script := filepath.Join(dir, "long-rank")
	rank := fmt.Sprintf("sleep 119.%d", os.Getpid())
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec "+rank+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	gwMarker := work + "/sites.conf" // on the gateways' command lines only
	argv := []string{wrap, "--shared-fs", "--workdir", work, "mpirun.openmpi", "--allow-run-as-root",
		"-np", "2", "--hostfile", hf, "--mca", "oob_tcp_if_include", testbed.LANCIDR, script}
	cmd := l.Command("node-1.site1", argv[0], argv[1:]...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Wait until both ranks run (the gateways were ready before mpirun).
	deadline := time.Now().Add(60 * time.Second)
	for len(processesWith(rank)) < 2 {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("ranks never started:\n%s", out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := len(processesWith(gwMarker)); n < 2 {
		t.Errorf("%d gateway processes run with map %s, want 2", n, gwMarker)
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		t.Logf("wrapper ended: %v\n%s", err, out.String())
		if err == nil {
			t.Errorf("wrapper exited 0 after SIGINT")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("wrapper still running 30s after SIGINT:\n%s", out.String())
	}
	waitGone(t, rank, 10*time.Second)
	waitGone(t, gwMarker, 10*time.Second)
}
