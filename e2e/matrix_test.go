package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestLabMatrixAlltoall: an 8-site lab built from the Grid'5000-like
// distance matrix (testbed/examples) has each pair's own RTT, and a
// verified MPI all-to-all (the FT pattern, one rank per site) runs through
// the full mesh of 8 gateways with Open MPI and MPICH: every one of the 56
// directions carries the job's blocks between gateways, none node to node.
func TestLabMatrixAlltoall(t *testing.T) {
	labRequireRoot(t)
	start := time.Now()
	m, err := testbed.ParseMatrixFile("../testbed/examples/grid5000-8sites.matrix", testbed.PairLink{})
	if err != nil {
		t.Fatal(err)
	}
	l := labUp(t, testbed.Config{Sites: m.Sites, Pairs: m.Pairs, Nodes: 1})
	t.Logf("8-site lab up in %v", time.Since(start).Round(time.Millisecond))
	c := l.Config()

	// Pairs with distinct RTTs: the nearest, a mid one, the farthest. The
	// path cost is calibrated once, on the first pair with the other 55
	// directions idle; on a loaded VM it drifts by up to about its own size
	// (CI read 3.18-3.37 ms on the 3 ms pair, path cost 0.62 ms), which is
	// the slack. A pair given another pair's delay still misses: the
	// nearest RTTs differ by 7 ms or more.
	for _, p := range [][2]string{{"lyon", "grenoble"}, {"rennes", "lille"}, {"sophia", "luxembourg"}} {
		want := c.Pair(p[0], p[1]).RTT
		from, to := "node-1."+p[0], "node-1."+p[1]
		labRTTWithin(t, from+" -> "+to, want, 0.05, l.PathCost(), func() []time.Duration {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := l.Ping(ctx, from, to, 20, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			return d
		})
	}

	wrap := wrapScript(t)
	var hosts []string
	nodes, gws := map[string]bool{}, map[string]bool{}
	for _, s := range c.Sites {
		h := "node-1." + s
		hosts = append(hosts, h)
		nodes[l.Addr(h).String()] = true
		gws[l.Addr("gw."+s).String()] = true
	}
	dir := t.TempDir()
	const iters, blockKiB = 2, 128 // ft blocks: 2 MiB x size-scale
	args := []string{"--workload", "ft", "--sites", "8", "--iters", fmt.Sprint(iters),
		"--size-scale", fmt.Sprint(blockKiB / 2048.0), "--compute-scale", "0.02", "--compute", "yield"}
	cases := []struct {
		name     string
		hostfile func(h string) string
		cmd      func(bin, hf string) []string
		// MPICH/UCX may never leave MPI_Finalize (see mpiJob): its verified
		// output is accepted after the grace time, without a second try,
		// which would only double the run time.
		mayHang bool
	}{
		{"openmpi", func(h string) string { return h + " slots=1\n" }, func(bin, hf string) []string {
			return append([]string{"mpirun.openmpi", "--allow-run-as-root", "-np", "8", "--hostfile", hf,
				"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
				"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR, bin}, args...)
		}, false},
		{"mpich", func(h string) string { return h + ":1\n" }, func(bin, hf string) []string {
			return append([]string{"mpiexec.mpich", "-launcher", "ssh", "-f", hf, "-n", "8",
				"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0", bin}, args...)
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bin, err := filepath.Abs("../bin/bench/" + tc.name + "/mpi5k-workload")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(bin); err != nil {
				t.Fatalf("%v (run `make all`)", err)
			}
			var hf strings.Builder
			for _, h := range hosts {
				hf.WriteString(tc.hostfile(h))
			}
			hfPath := filepath.Join(dir, tc.name+".hosts")
			if err := os.WriteFile(hfPath, []byte(hf.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			before, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			jobStart := time.Now()
			argv := append([]string{wrap, "--shared-fs", "--workdir", filepath.Join(dir, tc.name+".work")}, tc.cmd(bin, hfPath)...)
			out := mpiJob{Host: hosts[0], Argv: argv, Dir: dir, Timeout: 90 * time.Second,
				Done: "verified=yes", AcceptHang: tc.mayHang}.run(t, l)
			t.Logf("%s job took %v", tc.name, time.Since(jobStart).Round(time.Millisecond))
			res := regexp.MustCompile(`MPI5K-RESULT .*`).FindString(out)
			t.Logf("%s", res)
			if !strings.Contains(res, "ranks=8 sites=8") || !strings.Contains(res, "verified=yes") {
				t.Fatalf("no verified 8-site result; output:\n%s", lastLines(out, 30))
			}
			after, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Every rank sends one block per iteration to every other: each
			// direction carries iters blocks between its gateways.
			minBytes := uint64(iters * blockKiB << 10)
			var short []string
			for _, a := range c.Sites {
				for _, b := range c.Sites {
					if a == b {
						continue
					}
					d := [2]string{a, b}
					viaA, _ := shimWANBytes(after, d, gws)
					viaB, _ := shimWANBytes(before, d, gws)
					direct := wrapNodeBytes(after, a, b, nodes) - wrapNodeBytes(before, a, b, nodes)
					if viaA-viaB < minBytes {
						short = append(short, fmt.Sprintf("%s->%s %d B", a, b, viaA-viaB))
					}
					if direct > 64<<10 {
						t.Errorf("%s -> %s: %d bytes node to node, bypassing the gateways", a, b, direct)
					}
				}
			}
			if len(short) > 0 {
				t.Errorf("%d of 56 directions carried less than %d bytes between gateways: %s", len(short), minBytes, strings.Join(short, ", "))
			}
		})
	}
	var sb strings.Builder
	if st, err := l.Stats(); err == nil {
		st.WritePairs(&sb)
	}
	t.Logf("per-pair WAN after both jobs:\n%s", sb.String())
	t.Logf("TestLabMatrixAlltoall took %v", time.Since(start).Round(time.Millisecond))
}
