package e2e

import (
	"bufio"
	"context"
	"fmt"
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

// nodeListen is the loopback address of the node daemons the MX tests
// start themselves (mpi5k run draws its own).
const nodeListen = "127.0.0.1:5070"

// startNodeDaemons runs `mpi5k node` on every node host of the lab and
// waits until each serves; they are stopped (SIGINT) by the returned
// function or at cleanup.
func startNodeDaemons(t *testing.T, ctx context.Context, l *testbed.Lab) (stop func()) {
	bin, err := testbed.Binary()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			c.Process.Signal(os.Interrupt)
		}
		for _, c := range cmds {
			c.Wait()
		}
		cmds = nil
	}
	t.Cleanup(func() { stop() })
	for _, h := range l.Hosts("", false) {
		c := l.CommandContext(ctx, h, bin, "node", "--map", l.SiteMapPath(), "--lan-if", "eth0", "--listen", nodeListen)
		errp, _ := c.StderrPipe()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(errp)
			said := false
			for sc.Scan() {
				if !said && strings.Contains(sc.Text(), "node daemon ready") {
					said = true
					ready <- true
				}
				if !strings.Contains(sc.Text(), "level=INFO") {
					fmt.Fprintf(os.Stderr, "%s node daemon: %s\n", h, sc.Text())
				}
			}
			if !said {
				ready <- false
			}
		}()
		select {
		case ok := <-ready:
			if !ok {
				t.Fatalf("node daemon on %s exited before it served", h)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("node daemon on %s not ready after 15 s", h)
		}
	}
	return stop
}

// TestMXLab: the MX LAN transport end to end on the lab, on clean LANs
// and with 1 % of every site LAN's frames lost: 1000 checksummed streams
// from a node of site1 to one of site2 through both node daemons and both
// gateways (--lan-transport mx on each), then an Open MPI and an MPICH job
// that verify their messages, through `mpi5k run --lan-transport mx`.
func TestMXLab(t *testing.T) {
	labRequireRoot(t)
	for _, loss := range []float64{0, 0.01} {
		t.Run(fmt.Sprintf("lanloss%g", loss*100), func(t *testing.T) {
			l := labUp(t, testbed.Config{Nodes: 1, RTT: 5 * time.Millisecond, WANRate: 100e6, LANLoss: loss})
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			defer cancel()
			stopGW := startLabGateways(t, ctx, l, "--lan-transport", "mx", "--lan-if", "eth0")
			stopNodes := startNodeDaemons(t, ctx, l)
			dst := l.Addr("node-1.site2").String() + ":7000"
			startServer(t, ctx, l, "node-1.site2", "sumserve", dst)
			start := time.Now()
			v := run(t, ctx, l, "node-1.site1", "sumsend", dst, nodeListen, "1000", fmt.Sprint(64<<10), "32")
			t.Logf("1000 streams through MX LANs: %v bytes in %v", v[1], time.Since(start).Round(time.Millisecond))
			// The job's own gateways and daemons open the same MX endpoint
			// on the same interfaces: these go first.
			stopNodes()
			stopGW()
			for _, m := range chaosMPIs {
				t.Run(m.name, func(t *testing.T) {
					bin := buildMPI(t, m.mpicc, "chaos_mpi")
					dir := t.TempDir()
					hf := filepath.Join(dir, "hosts")
					if err := os.WriteFile(hf, []byte(m.hostfile), 0o644); err != nil {
						t.Fatal(err)
					}
					argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, "work"),
						"--lan-transport", "mx", "--lan-if", "eth0"}, m.argv(bin, hf, "1")...)
					out := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 90 * time.Second,
						Done: "chaos_mpi ok", Tries: 2, AcceptHang: m.finalizeMayHang}.run(t, l)
					// The job's connection crossed the gateways, not a direct
					// route the lab also has.
					opened := 0
					for _, m := range regexp.MustCompile(`(\d+) streams opened`).FindAllStringSubmatch(out, -1) {
						n, _ := strconv.Atoi(m[1])
						opened += n
					}
					if opened == 0 {
						t.Errorf("the gateways opened no stream: the job did not go through them:\n%s", out)
					}
					// Its bytes are in the summary: a renewed express link
					// used to take its counters along, leaving 0-84 bytes.
					sent := 0.0
					for _, m := range regexp.MustCompile(`([\d.]+) (B|KiB|MiB|GiB) sent`).FindAllStringSubmatch(out, -1) {
						v, _ := strconv.ParseFloat(m[1], 64)
						sent += v * map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]
					}
					if sent < 1024 {
						t.Errorf("the summary counts %.0f WAN bytes sent for a job that verified:\n%s", sent, out)
					}
					t.Logf("%s", lastLines(out, 7))
				})
			}
		})
	}
}
