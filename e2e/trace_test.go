package e2e

// End-to-end tests of the instrumentation (issue 7) on the emulated grid:
// tcpinfo on real lab sockets (idle restart, retransmissions under --loss
// cross-checked with the lab's wire counters) and a traced MPI run analysed
// by `mpi5k trace report|graph|timeline`. Root only (they skip otherwise).

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/tcpinfo"
	"github.com/mpi5k/mpi5k/testbed"
)

// traceSink listens on host:port and discards everything it reads.
func traceSink(t *testing.T, l *testbed.Lab, host string, port int) {
	t.Helper()
	var ln net.Listener
	if err := l.Do(host, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(l.Addr(host).String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(io.Discard, c) }()
		}
	}()
}

// traceDialCubic connects from host to to:port with congestion control
// cubic: Linux restarts slow start after idle for reno/cubic, never for BBR
// (this machine's default), see the tcpinfo package doc.
func traceDialCubic(t *testing.T, l *testbed.Lab, from, to string, port int) *net.TCPConn {
	t.Helper()
	var c net.Conn
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, "cubic")
		}); err != nil {
			return err
		}
		return serr
	}}
	if err := l.Do(from, func() (err error) {
		c, err = d.Dial("tcp4", net.JoinHostPort(l.Addr(to).String(), strconv.Itoa(port)))
		return err
	}); err != nil {
		t.Fatalf("dial %s -> %s with cubic: %v", from, to, err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// traceDrain waits until everything written on c was acknowledged.
func traceDrain(t *testing.T, c *net.TCPConn) tcpinfo.Info {
	t.Helper()
	var in tcpinfo.Info
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := tcpinfo.ReadConn(c, &in); err != nil {
			t.Fatal(err)
		}
		if in.Unacked == 0 && in.NotsentBytes == 0 {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("data not acknowledged after 20s: unacked %d, notsent %d", in.Unacked, in.NotsentBytes)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestTraceIdleRestartLab: on a cubic connection across the lab WAN, a gap
// shorter than the RTO keeps the congestion window; a gap of 1 s (> RTO)
// is reported by tcpinfo.Tracker as an idle restart, with the window cut
// at least in half and no retransmission.
func TestTraceIdleRestartLab(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 20 * time.Millisecond, WANRate: 200e6})
	a, b := "node-1.site1", "node-1.site2"
	traceSink(t, l, b, 7101)
	c := traceDialCubic(t, l, a, b, 7101)
	burst := make([]byte, 4<<20)
	var tr tcpinfo.Tracker
	tr.CongestionControl = "cubic"
	var ev []tcpinfo.Event
	sample := func() tcpinfo.Info {
		var in tcpinfo.Info
		if err := tcpinfo.ReadConn(c, &in); err != nil {
			t.Fatal(err)
		}
		ev = tr.Update(time.Now(), &in, ev[:0])
		return in
	}
	// Open the window with a 4 MiB burst, then wait for the ACKs.
	if _, err := c.Write(burst); err != nil {
		t.Fatal(err)
	}
	traceDrain(t, c)
	warm := sample()
	t.Logf("after 4 MiB: cwnd %d, ssthresh %d, rtt %v, rto %v", warm.SndCwnd, warm.SndSsthresh, warm.RTT, warm.RTO)
	if warm.SndCwnd <= 20 {
		t.Fatalf("cwnd %d after a 4 MiB burst: too small to see a restart", warm.SndCwnd)
	}
	// Control: a 50 ms gap (< RTO >= 200 ms) is no idle restart.
	time.Sleep(50 * time.Millisecond)
	if _, err := c.Write(burst[:64<<10]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	short := sample()
	if tr.C.IdleRestarts != 0 {
		t.Fatalf("50 ms gap reported as an idle restart: cwnd %d -> %d, events %v", warm.SndCwnd, short.SndCwnd, ev)
	}
	if short.SndCwnd < warm.SndCwnd/2 {
		t.Errorf("cwnd fell from %d to %d after a 50 ms gap", warm.SndCwnd, short.SndCwnd)
	}
	before := traceDrain(t, c)
	sample()
	// The real thing: 1 s idle, then a write.
	time.Sleep(time.Second)
	if _, err := c.Write(burst[:64<<10]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	after := sample()
	t.Logf("1 s idle: cwnd %d -> %d, rto %v, events %v", before.SndCwnd, after.SndCwnd, after.RTO, ev)
	if tr.C.IdleRestarts != 1 {
		t.Fatalf("idle restarts %d after a 1 s gap, want 1 (cwnd %d -> %d, events %v)", tr.C.IdleRestarts, before.SndCwnd, after.SndCwnd, ev)
	}
	for _, e := range ev {
		if e.Kind == tcpinfo.IdleRestart && (e.Idle <= after.RTO || e.To > e.From/2 && e.To > 10) {
			t.Errorf("idle restart event %v: idle must exceed the RTO %v and cwnd at least halve", e, after.RTO)
		}
	}
	if n := tr.C.RetransFast + tr.C.RetransRTO; n != 0 {
		t.Errorf("%d retransmissions on a loss-free lab", n)
	}
}

// TestTraceLossLab: with --loss 1% on the WAN, a bulk transfer's
// retransmissions appear both in the lab's wire counters (segments
// repeating sequence space on the link) and in tcpinfo's, which agree.
func TestTraceLossLab(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 10 * time.Millisecond, WANRate: 200e6, Loss: 0.01})
	a, b := "node-1.site1", "node-1.site2"
	traceSink(t, l, b, 7102)
	c := traceDialCubic(t, l, a, b, 7102)
	s := tcpinfo.NewSampler(nil)
	tc, err := s.AddConn("bulk", c)
	if err != nil {
		t.Fatal(err)
	}
	s.Sample(tc) // baseline before any data
	// The handshake's own retransmissions (a SYN or SYN-ACK lost to the
	// 1 % loss, the SYN retried after 1 s) precede the baseline: the
	// classification counts only what follows it.
	base, _, _ := tc.Last()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, 10*time.Millisecond); close(done) }()
	buf := make([]byte, 256<<10)
	for range 64 { // 16 MiB
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	final := traceDrain(t, c)
	cancel()
	<-done
	s.Sample(tc)
	cn := tc.Counters()
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().String()
	f := st.Link("site1", "site2").Flow("tcp", local, l.Addr(b).String()+":7102")
	if f == nil {
		t.Fatalf("flow %s not in the lab stats", local)
	}
	t.Logf("wire: %d packets, %d random drops, %d retransmitted segments; tcpinfo: total_retrans %d = %d before the baseline + %d fast + %d rto, %d RTOs, %d samples",
		f.Packets, f.RandomDrops, f.Retrans, final.TotalRetrans, base.TotalRetrans, cn.RetransFast, cn.RetransRTO, cn.RTOs, cn.Samples)
	if f.RandomDrops == 0 || f.Retrans == 0 {
		t.Fatalf("no loss on the wire: %+v", f)
	}
	if cn.TotalRetrans == 0 || cn.RetransFast == 0 {
		t.Fatalf("tcpinfo saw no (fast) retransmissions: %+v", cn)
	}
	if got := cn.RetransFast + cn.RetransRTO; got != uint64(cn.TotalRetrans-base.TotalRetrans) {
		t.Errorf("fast %d + rto %d != kernel total %d - %d at the baseline: some retransmissions unclassified", cn.RetransFast, cn.RetransRTO, cn.TotalRetrans, base.TotalRetrans)
	}
	// Every retransmitted segment crosses the link once (its own loss
	// included: the emulator counts it before dropping it).
	diff := int64(f.Retrans) - int64(cn.TotalRetrans)
	if diff < 0 {
		diff = -diff
	}
	if float64(diff) > 0.1*float64(cn.TotalRetrans)+3 {
		t.Errorf("wire retransmissions %d vs tcpinfo %d: differ by more than 10%%", f.Retrans, cn.TotalRetrans)
	}
}

// traceReport is the part of `mpi5k trace report --json` the test reads.
type traceReport struct {
	WAN struct {
		Conns   int   `json:"connections"`
		Writes  int   `json:"writes"`
		Bytes   int64 `json:"bytes"`
		Sampled int   `json:"sampled_connections"`
	} `json:"wan"`
	Class struct {
		Frequency, Size, Sync string
	} `json:"classification"`
	SitePairs []struct {
		From, To string
		Writes   int   `json:"writes"`
		Bytes    int64 `json:"bytes"`
	} `json:"site_pairs"`
	Connections []struct {
		Conn struct {
			ID      string `json:"id"`
			Relayed bool   `json:"relayed"`
		} `json:"connection"`
		Scope string `json:"scope"`
	} `json:"connections"`
}

// TestTraceMPILab: Open MPI and MPICH runs traced through `mpi5k run
// --trace` (ranks -> shim -> gateways) produce a report whose WAN bytes
// cover the payload the program sent across sites, a graph with both sites
// and red WAN edges, and a timeline PNG.
func TestTraceMPILab(t *testing.T) {
	labRequireRoot(t)
	mpi5k, err := testbed.Binary()
	if err != nil {
		t.Fatal(err)
	}
	bindir := filepath.Dir(mpi5k)
	for _, f := range []string{"libmpi5k.so", "mpi5k-gateway"} {
		if _, err := os.Stat(filepath.Join(bindir, f)); err != nil {
			t.Fatalf("need %s (run make): %v", f, err)
		}
	}
	l := labUp(t, testbed.Config{Nodes: 2, RTT: 20 * time.Millisecond, WANRate: 200e6})
	sites := traceSitesFile(t, l)
	pingpong := map[string]string{}
	cases := []struct {
		name    string
		payload int64 // bytes the program sends across sites, at least
		done    string
		tries   int // runs allowed when the job hangs in MPI_Finalize
		argv    func(t *testing.T) []string
	}{
		{"openmpi", 7192576, "MPI5K-RESULT", 1, func(t *testing.T) []string {
			w := filepath.Join(bindir, "bench", "openmpi", "mpi5k-workload")
			if _, err := os.Stat(w); err != nil {
				t.Skipf("%s not built (make bench-bin): %v", w, err)
			}
			hosts := "node-1.site1,node-2.site1,node-1.site2,node-2.site2"
			return []string{"mpirun.openmpi", "--allow-run-as-root", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
				"--mca", "mpi_yield_when_idle", "1", "--mca", "btl_tcp_if_include", testbed.LANCIDR,
				"--mca", "oob_tcp_if_include", testbed.LANCIDR, "-np", "4", "-H", hosts, w, "--workload", "bt", "--scale", "0.2"}
		}},
		// MPICH 4.0/UCX may hang in MPI_Finalize even after the
		// ping-pong's final barrier (see mpiJob): such a run is
		// interrupted and traced again.
		{"mpich", 2 * 10 * (1 + 1024 + 65536 + 1<<20), "pingpong ok", 2, func(t *testing.T) []string {
			pingpong["mpich"] = labBuildPingPong(t, "mpicc.mpich")
			return []string{"mpiexec.mpich", "-launcher", "ssh", "-hosts", "node-1.site1,node-1.site2", "-n", "2",
				"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0", pingpong["mpich"], "10"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "trace")
			job := mpiJob{Host: "node-1.site1", Argv: append([]string{mpi5k, "run", "--sites", sites, "--trace", dir}, tc.argv(t)...),
				Timeout: 150 * time.Second, Done: tc.done, Tries: tc.tries, AcceptHang: tc.name == "mpich",
				Before: func(int) {
					if err := os.RemoveAll(dir); err != nil {
						t.Fatal(err)
					}
					if err := os.Mkdir(dir, 0o755); err != nil {
						t.Fatal(err)
					}
				}}
			out := job.run(t, l)
			t.Logf("%s", lastLines(out, 6))
			files, _ := filepath.Glob(filepath.Join(dir, "*.trace"))
			if len(files) == 0 {
				t.Fatalf("no trace files in %s", dir)
			}
			js, err := exec.Command(mpi5k, "trace", "report", dir, "--json").CombinedOutput()
			if err != nil {
				t.Fatalf("trace report: %v\n%s", err, js)
			}
			var r traceReport
			if err := json.Unmarshal(js, &r); err != nil {
				t.Fatalf("report JSON: %v", err)
			}
			t.Logf("WAN: %d connections, %d writes, %d bytes, %d sampled; workload %s/%s/%s",
				r.WAN.Conns, r.WAN.Writes, r.WAN.Bytes, r.WAN.Sampled, r.Class.Frequency, r.Class.Size, r.Class.Sync)
			// The shim samples every rank socket (default period 100 ms,
			// plus at open and close).
			if r.WAN.Sampled == 0 {
				t.Errorf("no TCP_INFO samples of the ranks' sockets")
			}
			if r.WAN.Bytes < tc.payload {
				t.Errorf("WAN bytes %d < payload %d sent across sites", r.WAN.Bytes, tc.payload)
			}
			dirs := map[string]bool{}
			for _, p := range r.SitePairs {
				if p.From != p.To && p.Writes > 0 {
					dirs[p.From+">"+p.To] = true
				}
			}
			if !dirs["site1>site2"] || !dirs["site2>site1"] {
				t.Errorf("site pairs with WAN writes: %v, want both directions", dirs)
			}
			relayed := 0
			for _, c := range r.Connections {
				if c.Scope == "wan" && c.Conn.Relayed {
					relayed++
				}
			}
			if relayed == 0 {
				t.Errorf("no WAN connection went through a gateway")
			}
			txt, err := exec.Command(mpi5k, "trace", "report", dir).CombinedOutput()
			if err != nil || !bytes.Contains(txt, []byte("site pairs")) {
				t.Errorf("text report: %v\n%s", err, txt)
			}
			svg := filepath.Join(dir, "comm.svg")
			if out, err := exec.Command(mpi5k, "trace", "graph", dir, "-o", svg).CombinedOutput(); err != nil {
				t.Fatalf("trace graph: %v\n%s", err, out)
			}
			g, _ := os.ReadFile(svg)
			for _, want := range []string{"<svg", "site site1", "site site2", `stroke="red"`} {
				if !bytes.Contains(g, []byte(want)) {
					t.Errorf("graph SVG lacks %q", want)
				}
			}
			// dot escapes the hyphen of host names.
			if !bytes.Contains(g, []byte("node&#45;1.site2")) && !bytes.Contains(g, []byte("node-1.site2")) {
				t.Errorf("graph SVG lacks host node-1.site2")
			}
			pngf := filepath.Join(dir, "t.png")
			if out, err := exec.Command(mpi5k, "trace", "timeline", dir, "-o", pngf).CombinedOutput(); err != nil {
				t.Fatalf("trace timeline: %v\n%s", err, out)
			}
			pf, err := os.Open(pngf)
			if err != nil {
				t.Fatal(err)
			}
			defer pf.Close()
			img, err := png.Decode(pf)
			if err != nil || img.Bounds().Dx() < 500 {
				t.Errorf("timeline PNG: %v", err)
			}
			if d := os.Getenv("MPI5K_TRACE_KEEP"); d != "" {
				dst := filepath.Join(d, tc.name)
				os.RemoveAll(dst)
				if out, err := exec.Command("cp", "-r", dir, dst).CombinedOutput(); err != nil {
					t.Logf("keeping the trace: %v %s", err, out)
				}
			}
		})
	}
}

// traceSitesFile writes the "<address> <site>" file of mpi5k run --sites
// for every host of the lab, gateways included.
func traceSitesFile(t *testing.T, l *testbed.Lab) string {
	t.Helper()
	sites := filepath.Join(t.TempDir(), "sites")
	var sb strings.Builder
	for _, s := range l.Sites() {
		for _, h := range l.Hosts(s, true) {
			sb.WriteString(l.Addr(h).String() + " " + s + "\n")
		}
	}
	if err := os.WriteFile(sites, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return sites
}

var lastLinesRe = regexp.MustCompile(`\n+$`)

func lastLines(s string, n int) string {
	lines := strings.Split(lastLinesRe.ReplaceAllString(s, ""), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
