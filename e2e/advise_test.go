package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestTraceAdviseLab: the CG pattern pairs rank r with rank r+size/2, so
// with 4 ranks placed in blocks (0 1 | 2 3) every exchange crosses the
// WAN, and the best placement puts 0 with 2 and 1 with 3. A traced run in
// blocks, then `mpi5k trace advise`: it must propose that placement, and a
// second run with its host file must cut the bytes between the gateways by
// the fraction it predicted, within 10 %.
func TestTraceAdviseLab(t *testing.T) {
	labRequireRoot(t)
	mpi5k, err := testbed.Binary()
	if err != nil {
		t.Fatal(err)
	}
	bindir := filepath.Dir(mpi5k)
	w := filepath.Join(bindir, "bench", "openmpi", "mpi5k-workload")
	if _, err := os.Stat(w); err != nil {
		t.Fatalf("%v (run `make all`)", err)
	}
	l := labUp(t, testbed.Config{Nodes: 2, RTT: 10 * time.Millisecond, WANRate: 200e6})
	tmp := t.TempDir()
	sites := traceSitesFile(t, l)
	gws := map[string]bool{}
	for _, s := range l.Sites() {
		gws[l.Addr("gw."+s).String()] = true
	}
	// wanBytes: TCP bytes between the gateways, both directions, during run.
	run := func(name string, placement ...string) (uint64, string) {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		before, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		argv := append([]string{mpi5k, "run", "--sites", sites, "--trace", dir, "--wan-prime=false",
			"mpirun.openmpi", "--allow-run-as-root", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
			"--mca", "mpi_yield_when_idle", "1", "--mca", "btl_tcp_if_include", testbed.LANCIDR,
			"--mca", "oob_tcp_if_include", testbed.LANCIDR, "-np", "4"}, placement...)
		argv = append(argv, w, "--workload", "cg", "--iters", "8", "--compute-scale", "0.05", "--compute", "yield")
		out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: tmp, Timeout: 90 * time.Second, Done: "verified=yes"}.run(t, l)
		t.Logf("%s: %s", name, regexp.MustCompile(`MPI5K-RESULT .*`).FindString(out))
		after, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, d := range [][2]string{{"site1", "site2"}, {"site2", "site1"}} {
			a, _ := shimWANBytes(after, d, gws)
			b, _ := shimWANBytes(before, d, gws)
			n += a - b
		}
		return n, dir
	}
	blocks, dir := run("blocks", "-H", "node-1.site1,node-2.site1,node-1.site2,node-2.site2")
	hf := filepath.Join(tmp, "advised.hosts")
	out, err := exec.Command(mpi5k, "trace", "advise", dir, "-o", hf).CombinedOutput()
	t.Logf("trace advise:\n%s", out)
	if err != nil {
		t.Fatalf("trace advise: %v", err)
	}
	b, _ := os.ReadFile(hf)
	hosts := strings.Fields(string(b))
	site := func(h string) string { return h[strings.IndexByte(h, '.')+1:] }
	if len(hosts) != 4 || site(hosts[0]) != site(hosts[2]) || site(hosts[1]) != site(hosts[3]) || site(hosts[0]) == site(hosts[1]) {
		t.Fatalf("advised placement %v: want ranks 0 and 2 in one site, 1 and 3 in the other", hosts)
	}
	m := regexp.MustCompile(`WAN bytes: .*\(([-+0-9.]+) %\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no predicted WAN byte change in the summary")
	}
	predicted, _ := strconv.ParseFloat(string(m[1]), 64)
	advised, _ := run("advised", "--hostfile", hf, "--mca", "rmaps", "seq")
	measured := 100 * (float64(advised) - float64(blocks)) / float64(blocks)
	t.Logf("bytes between gateways: %d in blocks, %d as advised: %.1f %% (predicted %.1f %%)", blocks, advised, measured, predicted)
	if d := measured - predicted; d > 0.1*-predicted || d < 0.1*predicted {
		t.Errorf("WAN bytes changed by %.1f %%, predicted %.1f %% (want within 10 %% of it)", measured, predicted)
	}
}
