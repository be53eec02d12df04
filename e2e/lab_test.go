package e2e

// End-to-end tests of the emulated grid (`mpi5k lab`, package testbed).
// They need root (namespaces, TUN, mounts) and bin/mpi5k (run `make`, or set
// MPI5K_BIN); without root they skip.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
	"golang.org/x/sys/unix"
)

var labSeq atomic.Int32

func labRequireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("lab tests need root (network namespaces, TUN devices, mounts); run as root, e.g. in CI")
	}
	if _, err := testbed.Binary(); err != nil {
		t.Fatalf("lab tests need bin/mpi5k: %v", err)
	}
}

// labUp brings a lab up with a unique name and registers its teardown, which
// also checks that nothing the lab made is left.
func labUp(t *testing.T, c testbed.Config) *testbed.Lab {
	t.Helper()
	if c.Name == "" {
		c.Name = fmt.Sprintf("e2elab%d_%d", os.Getpid()%10000, labSeq.Add(1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := testbed.Up(ctx, c)
	if err != nil {
		t.Fatalf("lab up %s: %v", c.Name, err)
	}
	t.Logf("lab %s: path cost %v, one-way delay %v", l.Name(), l.PathCost(), l.OneWayDelay())
	t.Cleanup(func() {
		if err := testbed.Down(l.Name()); err != nil {
			t.Errorf("lab down: %v", err)
		}
		labCheckGone(t, l.Name())
	})
	// Registered last, so it runs first, while the lab is still up.
	t.Cleanup(func() { labNoteStall(t, l) })
	return l
}

// stalledEnv names the file where a failed test whose lab stalled is
// recorded (scripts/e2e.sh runs such tests once more, and only those).
const stalledEnv = "MPI5K_E2E_STALLED"

// labNoteStall records a failed test if the lab's emulator was starved of
// CPU during it (packets left it a second or more late): the machine, not
// mpi5k, may have failed it (testbed/README.md, "Known problems").
func labNoteStall(t *testing.T, l *testbed.Lab) {
	if !t.Failed() {
		return
	}
	st, err := l.Stats()
	if err != nil || st.Stalled() == 0 {
		return
	}
	t.Logf("lab %s stalled during this test: %d packets left the WAN emulator %v or more late", l.Name(), st.Stalled(), testbed.StallLate)
	path := os.Getenv(stalledEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("recording the stall: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %d\n", strings.SplitN(t.Name(), "/", 2)[0], st.Stalled())
}

// labCheckGone fails if any namespace, state file or process of the lab is
// left.
func labCheckGone(t *testing.T, name string) {
	t.Helper()
	// Namespace files live under /run/mpi5k/<lab>/netns (checked below);
	// no mount of the lab may be left anywhere.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, filepath.Join(testbed.RunDir, name)+"/") {
				t.Errorf("mount left after down: %s", line)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(testbed.RunDir, name)); err == nil {
		t.Errorf("%s left after down", filepath.Join(testbed.RunDir, name))
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, "--name "+name+" ") && strings.Contains(cl, "lab ") && !labZombie(p.Name()) {
			t.Errorf("process %s left after down: %s", p.Name(), cl)
		}
	}
}

func labZombie(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

func labMedian(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func labMean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

// labTCPRTT measures 1-byte TCP ping-pong round trips between two hosts
// with an in-process client and echo server opened in their namespaces.
func labTCPRTT(t *testing.T, l *testbed.Lab, from, to string, n int) []time.Duration {
	t.Helper()
	var ln net.Listener
	if err := l.Do(to, func() (err error) {
		ln, err = net.Listen("tcp4", l.Addr(to).String()+":7007")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := l.Do(from, func() (err error) {
		c, err = net.DialTimeout("tcp4", l.Addr(to).String()+":7007", 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	b := []byte{1}
	var rtts []time.Duration
	for i := 0; i < n+3; i++ {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(b); err != nil {
			t.Fatal(err)
		}
		if i >= 3 { // the first exchanges open the congestion window
			rtts = append(rtts, time.Since(start))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return rtts
}

// labRTTWithin checks that the median of a round-trip sample is within
// bound (a fraction) of want, plus slack for what the lab does not emulate. The lab's path cost (veths, TUN, waking idle
// vCPUs; 0.3-0.5 ms here) is calibrated once at lab up and drifts with the
// VM's load, so one sample of 20-40 round trips now and then lands a few
// hundred microseconds off (CI saw 10.40 ms on a 10 ms lab). A miss is
// measured again, up to three samples a second apart: a lab whose delay is
// really wrong misses every time, a noisy moment does not.
func labRTTWithin(t *testing.T, what string, want time.Duration, bound float64, slack time.Duration, sample func() []time.Duration) {
	t.Helper()
	var meds []time.Duration
	for try := 0; try < 3; try++ {
		if try > 0 {
			time.Sleep(time.Second)
		}
		d := sample()
		med := labMedian(d)
		meds = append(meds, med)
		t.Logf("%s rtt: median %v mean %v over %d (set %v)", what, med, labMean(d), len(d), want)
		if math.Abs(float64(med-want)) <= bound*float64(want)+float64(slack) {
			return
		}
	}
	t.Errorf("%s median rtt %v in three samples, each more than %.0f%% + %v off %v", what, meds, bound*100, slack, want)
}

// userWake is what a TCP round trip between two user-space ends costs beyond
// the kernel's echo of a ping, which the lab's calibration measures: a wake-up
// of each end (CI read TCP medians 40-70 us above ping in one run).
const userWake = 100 * time.Microsecond

// TestLabRTT: ping round trips between node-1.site1 and node-1.site2 are
// within 3 % of --rtt, TCP round trips within 3 % plus userWake.
func TestLabRTT(t *testing.T) {
	labRequireRoot(t)
	for _, rtt := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(rtt.String(), func(t *testing.T) {
			l := labUp(t, testbed.Config{Nodes: 1, RTT: rtt, WANRate: 100e6})
			a, b := "node-1.site1", "node-1.site2"
			labRTTWithin(t, "ping", rtt, 0.03, 0, func() []time.Duration {
				pings, err := l.Ping(context.Background(), a, b, 40, 10*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				if len(pings) < 38 {
					t.Fatalf("only %d of 40 pings answered", len(pings))
				}
				return pings
			})
			labRTTWithin(t, "tcp", rtt, 0.03, userWake, func() []time.Duration { return labTCPRTT(t, l, a, b, 40) })
		})
	}
}

// labIperf runs one iperf3 TCP flow from host a to host b and returns the
// receiver's goodput in bit/s.
func labIperf(t *testing.T, l *testbed.Lab, a, b string, port, secs int, extra ...string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	srv := l.CommandContext(ctx, b, "iperf3", "-s", "-1", "-p", fmt.Sprint(port))
	var srvOut strings.Builder
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	time.Sleep(300 * time.Millisecond) // server start (a connect would use up -1)
	args := append([]string{"-c", l.Addr(b).String(), "-p", fmt.Sprint(port), "-t", fmt.Sprint(secs), "-O", "2", "-J"}, extra...)
	out, err := l.CommandContext(ctx, a, "iperf3", args...).Output()
	if err != nil {
		t.Fatalf("iperf3 client: %v\n%s\nserver: %s", err, out, srvOut.String())
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3 JSON: %v\n%s", err, out)
	}
	t.Logf("iperf3 %s -> %s: %.1f Mbit/s, %d retransmits", a, b, res.End.SumReceived.BitsPerSecond/1e6, res.End.SumSent.Retransmits)
	return res.End.SumReceived.BitsPerSecond
}

// TestLabRate: one iperf3 TCP flow reaches 90-102 % of --wan-rate at 100
// and 200 Mbit/s with 20 ms RTT.
// TestLabHostCC: --host-cc sets the default congestion control of every
// lab host (what the ranks' direct connections use), and an algorithm the
// kernel lacks is refused before anything is built.
func TestLabHostCC(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: time.Millisecond, HostCC: "reno"})
	hosts := append(l.Hosts("", true), l.ExtraHosts("")...)
	if len(hosts) != 6 {
		t.Fatalf("want 6 hosts (nodes, gateways, traffic hosts), got %v", hosts)
	}
	for _, h := range hosts {
		var cc string
		err := l.Do(h, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			cc, err = unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
			return err
		})
		if err != nil || strings.TrimRight(cc, "\x00") != "reno" {
			t.Errorf("%s: new TCP socket uses %q (%v), want reno", h, cc, err)
		}
	}
	// An algorithm the kernel lacks (and no module provides) is refused
	// before anything is built; TestLabHostCCAllowed covers one the
	// kernel has but does not allow.
	name := fmt.Sprintf("e2ecc%d", os.Getpid()%10000)
	_, err := testbed.Up(context.Background(), testbed.Config{Name: name, Nodes: 1, HostCC: "nosuchcc"})
	if err == nil {
		testbed.Down(name)
		t.Fatal("host-cc nosuchcc accepted")
	}
	if !strings.Contains(err.Error(), "host-cc") || !strings.Contains(err.Error(), "tcp_available_congestion_control") {
		t.Errorf("host-cc nosuchcc: unclear error %v", err)
	}
	if _, serr := os.Stat("/run/mpi5k/" + name); serr == nil {
		t.Errorf("refused lab %s left files behind", name)
	}
}

func TestLabRate(t *testing.T) {
	labRequireRoot(t)
	for _, rate := range []uint64{100e6, 200e6} {
		t.Run(fmt.Sprintf("%dmbit", rate/1e6), func(t *testing.T) {
			l := labUp(t, testbed.Config{Nodes: 1, RTT: 20 * time.Millisecond, WANRate: rate})
			// A flow whose packets the starved emulator sends late
			// bunches, overflows the queue and backs off (CI read 84 %
			// at 200 Mbit/s with 129 queue drops and late p99 17 ms), so
			// a miss is measured again, up to three flows: a shaper set
			// to the wrong rate misses every one.
			var fracs []float64
			var delivered uint64
			for try := 0; try < 3; try++ {
				got := labIperf(t, l, "node-1.site1", "node-1.site2", 5301+try, 8)
				frac := got / float64(rate)
				fracs = append(fracs, frac)
				s, err := l.Stats()
				if err != nil {
					t.Fatal(err)
				}
				ls := s.Link("site1", "site2")
				if ls == nil {
					t.Fatal("no site1->site2 link in the lab's stats")
				}
				t.Logf("flow %d: %.1f Mbit/s (%.1f%%); site1->site2 so far: %d packets, %d queue drops, late p99 %v",
					try+1, got/1e6, frac*100, ls.Packets, ls.QueueDrops, ls.Late.P99)
				// The link counts every flow so far: this one's bytes
				// are what it delivered beyond the earlier flows'.
				if ls.DeliveredBytes-delivered < uint64(got/8*8*0.9) {
					t.Errorf("site1->site2 link delivered %d bytes during flow %d, less than the flow's %.0f",
						ls.DeliveredBytes-delivered, try+1, got/8*8)
				}
				delivered = ls.DeliveredBytes
				if frac >= 0.90 && frac <= 1.02 {
					return
				}
			}
			t.Errorf("goodput %.3f of --wan-rate %d Mbit/s in three flows, each outside 0.90-1.02", fracs, rate/1e6)
		})
	}
}

// TestLabLoss: --loss 1% drops 1 % +- 0.2 of >= 100k UDP packets, measured
// by the receiver.
func TestLabLoss(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 2 * time.Millisecond, WANRate: 1e9, Loss: 0.01, Queue: 8 << 20})
	a, b := "node-1.site1", "node-1.site2"
	var rc *net.UDPConn
	if err := l.Do(b, func() (err error) {
		rc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(l.Addr(b).AsSlice()), Port: 7008})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	// SO_RCVBUFFORCE: a new namespace caps SO_RCVBUF at 208 KiB, which a
	// receiver delayed by a busy machine overflows (counted as loss here).
	if raw, err := rc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 64<<20)
		})
	}
	rcvbufErrors := func() string {
		var snmp []byte
		_ = l.Do(b, func() (err error) {
			snmp, err = os.ReadFile("/proc/thread-self/net/snmp")
			return err
		})
		lines := strings.Split(string(snmp), "\n")
		for i := 0; i+1 < len(lines); i++ {
			if strings.HasPrefix(lines[i], "Udp:") && strings.HasPrefix(lines[i+1], "Udp:") {
				return lines[i] + " / " + lines[i+1]
			}
		}
		return ""
	}
	var sc *net.UDPConn
	if err := l.Do(a, func() (err error) {
		sc, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IP(l.Addr(b).AsSlice()), Port: 7008})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	const total = 120000
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 2048)
		n := 0
		for {
			_ = rc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := rc.Read(buf); err != nil {
				got <- n
				return
			}
			n++
		}
	}()
	// ~40k packets/s in bursts of 20: well below what the emulator and the
	// receiver handle, so every missing packet is a random drop.
	msg := make([]byte, 200)
	start := time.Now()
	for i := 0; i < total; i++ {
		if _, err := sc.Write(msg); err != nil {
			t.Fatal(err)
		}
		if i%20 == 19 {
			if d := time.Duration(i+1)*25*time.Microsecond - time.Since(start); d > 0 {
				time.Sleep(d)
			}
		}
	}
	recv := <-got
	t.Logf("receiver UDP counters: %s", rcvbufErrors())
	loss := 1 - float64(recv)/total
	s, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	ls := s.Link("site1", "site2")
	f := ls.Flow("udp", l.Addr(a).String()+":", l.Addr(b).String()+":7008")
	if f == nil {
		t.Fatalf("UDP flow not in stats: %+v", ls.Flows)
	}
	t.Logf("sent %d, received %d: loss %.3f%%; emulator saw %d packets, %d random drops, %d queue drops", total, recv, loss*100, f.Packets, f.RandomDrops, f.QueueDrops)
	if f.Packets != total {
		t.Errorf("emulator saw %d of %d packets sent", f.Packets, total)
	}
	if f.QueueDrops != 0 {
		t.Errorf("%d queue drops: the loss measure is not only random loss", f.QueueDrops)
	}
	if math.Abs(loss-0.01) > 0.002 {
		t.Errorf("measured loss %.3f%%, want 1%% +- 0.2", loss*100)
	}
}

// labBuildPingPong compiles testdata/lab_pingpong.c with an MPI compiler.
func labBuildPingPong(t *testing.T, mpicc string) string {
	t.Helper()
	if _, err := exec.LookPath(mpicc); err != nil {
		t.Fatalf("%s not installed (apt packages libopenmpi-dev, libmpich-dev): %v", mpicc, err)
	}
	src, err := filepath.Abs("testdata/lab_pingpong.c")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pingpong")
	if b, err := exec.Command(mpicc, "-O2", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mpicc, err, b)
	}
	return out
}

// TestLabMPI: unmodified mpirun of Open MPI 4.1 and mpiexec of MPICH 4.0
// run a 2-rank ping-pong with one rank per site, and the traffic crosses the
// emulated WAN (seen in the link stats).
func TestLabMPI(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 10 * time.Millisecond, WANRate: 200e6})
	hosts := "node-1.site1,node-1.site2"
	cases := []struct {
		name, mpicc string
		tries       int // runs allowed when the job hangs in MPI_Finalize (see mpiJob)
		cmd         func(bin string) []string
	}{
		{"openmpi", "mpicc.openmpi", 1, func(bin string) []string {
			return []string{"mpirun.openmpi", "--allow-run-as-root", "--mca", "plm_rsh_agent", "ssh",
				"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
				"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR,
				"-np", "2", "-H", hosts, bin, "10"}
		}},
		{"mpich", "mpicc.mpich", 2, func(bin string) []string {
			return []string{"mpiexec.mpich", "-launcher", "ssh", "-hosts", hosts, "-n", "2",
				"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0", bin, "10"}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := labBuildPingPong(t, c.mpicc)
			before, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			job := mpiJob{Host: "node-1.site1", Argv: c.cmd(bin), Dir: filepath.Dir(bin),
				Timeout: 90 * time.Second, Done: "pingpong ok", Tries: c.tries,
				AcceptHang: c.name == "mpich"}
			out := job.run(t, l)
			t.Logf("%s:\n%s", strings.Join(job.Argv, " "), out)
			for _, want := range []string{"on node-1.site1", "on node-1.site2", "pingpong ok"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			after, err := l.Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Rank 0 sent 10 x (1 B + 1 KiB + 64 KiB + 1 MiB) to rank 1 over TCP
			// between the nodes' LAN addresses, through the WAN link.
			crossed := labTCPBytes(after, "site1", "site2", l.Addr("node-1.site1").String(), l.Addr("node-1.site2").String()) -
				labTCPBytes(before, "site1", "site2", l.Addr("node-1.site1").String(), l.Addr("node-1.site2").String())
			const payload = 10 * (1 + 1024 + 65536 + 1<<20)
			t.Logf("TCP bytes node-1.site1 -> node-1.site2 on the WAN link: %d (payload %d)", crossed, payload)
			if crossed < payload {
				t.Errorf("only %d bytes crossed the emulated WAN site1->site2, want >= %d", crossed, payload)
			}
		})
	}
}

func labTCPBytes(s testbed.Stats, from, to, src, dst string) uint64 {
	ls := s.Link(from, to)
	if ls == nil {
		return 0
	}
	var n uint64
	for _, f := range ls.Flows {
		if f.Proto == "tcp" && strings.HasPrefix(f.Src, src+":") && strings.HasPrefix(f.Dst, dst+":") {
			n += f.Bytes
		}
	}
	return n
}

// TestLabCLI drives the command line: hosts, exec (hostname, cwd, env, name
// resolution), the ssh agent, stats --json, cross and --stop, down.
// labCommand runs `mpi5k lab ARGS` with bin and returns its output; a
// failure fails the test with it.
func labCommand(t *testing.T, bin string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"lab"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("mpi5k lab %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}

func TestLabCLI(t *testing.T) {
	labRequireRoot(t)
	bin, _ := testbed.Binary()
	name := fmt.Sprintf("e2ecli%d", os.Getpid()%10000)
	run := labCommand(t, bin)
	// Bad flag values are refused with the flag's name.
	for _, bad := range [][]string{{"--rtt", "fast"}, {"--wan-rate", "lots"}, {"--loss", "5x"}, {"--queue", "big"}, {"--sites", "1"}, {"--gateway-nics", "3"}, {"--cross-mtu", "1000"}} {
		out, err := exec.Command(bin, append([]string{"lab", "up", "--name", name}, bad...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad[0]) {
			t.Errorf("lab up %v: want an error naming %s, got %v: %s", bad, bad[0], err, out)
		}
	}
	run("up", "--name", name, "--sites", "lyon,rennes", "--nodes", "2", "--rtt", "10ms", "--wan-rate", "100mbit",
		"--lan-rate", "1gbit", "--loss", "0%", "--jitter", "0ms", "--queue", "1bdp", "--mtu", "1500", "--cross-mtu", "9000", "--gateway-nics", "2")
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "lab", "down", "--name", name).CombinedOutput(); err != nil {
			t.Errorf("lab down: %v %s", err, out)
		}
		labCheckGone(t, name)
		// Idempotent.
		if out, err := exec.Command(bin, "lab", "down", "--name", name).CombinedOutput(); err != nil {
			t.Errorf("second lab down: %v %s", err, out)
		}
	})
	if got := run("hosts", "--name", name); got != "node-1.lyon\nnode-2.lyon\nnode-1.rennes\nnode-2.rennes\n" {
		t.Errorf("hosts: %q", got)
	}
	if got := run("hosts", "--name", name, "--site", "rennes", "--gateways"); got != "node-1.rennes\nnode-2.rennes\ngw.rennes\n" {
		t.Errorf("hosts --site rennes --gateways: %q", got)
	}
	wd := t.TempDir()
	cmd := exec.Command(bin, "lab", "exec", "--name", name, "node-2.lyon", "--", "sh", "-c",
		`hostname; pwd; echo "$MPI5K_GATEWAYS $MPI5K_LAB"; getent hosts gw.rennes; ssh -x -o BatchMode=yes node-1.rennes 'hostname; pwd'`)
	cmd.Dir = wd
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lab exec: %v\n%s", err, out)
	}
	want := fmt.Sprintf("node-2.lyon\n%s\nlyon=gw.lyon,rennes=gw.rennes %s\n10.77.2.2       gw.rennes\nnode-1.rennes\n%s\n", wd, name, wd)
	if string(out) != want {
		t.Errorf("lab exec output:\n%q\nwant\n%q", out, want)
	}
	// The machine's own /etc/hosts is untouched.
	if b, _ := os.ReadFile("/etc/hosts"); strings.Contains(string(b), "gw.rennes") {
		t.Error("/etc/hosts of the machine mentions lab hosts")
	}
	sm, err := os.ReadFile(filepath.Join(testbed.RunDir, name, "sites.conf"))
	if err != nil || !strings.Contains(string(sm), "site rennes id=2 lan=10.77.2.2:5000 wan=10.78.2.2:5001") {
		t.Errorf("site map: %v\n%s", err, sm)
	}

	l, err := testbed.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	// Gateway to gateway over the WAN legs crosses the same emulated link as
	// node traffic, with the same delay.
	ctx := context.Background()
	if _, err := l.PingAddr(ctx, "gw.lyon", l.WANAddr("gw.rennes"), 2, 5*time.Millisecond); err != nil { // ARP warm-up
		t.Fatal(err)
	}
	labRTTWithin(t, "gateway WAN-leg", 10*time.Millisecond, 0.03, 0, func() []time.Duration {
		gwRTT, err := l.PingAddr(ctx, "gw.lyon", l.WANAddr("gw.rennes"), 20, 10*time.Millisecond)
		if err != nil || len(gwRTT) < 18 {
			t.Fatalf("gateway WAN-leg ping: %v %v", gwRTT, err)
		}
		return gwRTT
	})
	t.Logf("lab path cost %v", l.PathCost())
	s, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	lr := s.Link("lyon", "rennes")
	if lr == nil || lr.Flow("icmp", l.WANAddr("gw.lyon").String(), l.WANAddr("gw.rennes").String()) == nil {
		t.Errorf("gateway WAN-leg ping not seen on the lyon->rennes link: %+v", lr)
	}

	// Cross traffic: 2 flows lyon -> rennes, visible in stats, then
	// stopped; in jumbo frames (--cross-mtu), while the nodes keep 1500.
	run("cross", "--name", name, "--from", "lyon", "--to", "rennes", "--flows", "2", "--duration", "30s")
	time.Sleep(3 * time.Second)
	var js testbed.Stats
	if err := json.Unmarshal([]byte(run("stats", "--name", name, "--json")), &js); err != nil {
		t.Fatal(err)
	}
	flows := 0
	for _, f := range js.Link("lyon", "rennes").Flows {
		if f.Proto == "tcp" && strings.HasPrefix(f.Src, l.Addr("x-1.lyon").String()+":") && f.Bytes > 1<<20 {
			flows++
			if per := f.Bytes / max(f.Packets, 1); per < 4000 {
				t.Errorf("cross flow %s: %d bytes a packet with --cross-mtu 9000, want jumbo frames", f.Src, per)
			}
		}
	}
	if flows != 2 {
		t.Errorf("want 2 cross flows of > 1 MiB from x-1.lyon, got %d: %+v", flows, js.Link("lyon", "rennes").Flows)
	}
	if text := run("stats", "--name", name); !strings.Contains(text, "lyon -> rennes") || !strings.Contains(text, "retrans") {
		t.Errorf("stats text:\n%s", text)
	}
	if out := run("cross", "--name", name, "--stop"); !strings.Contains(out, "stopped 4 ") {
		t.Errorf("cross --stop: %s (want 2 clients + 2 servers stopped)", out)
	}
}

// TestLabCLIGateways: `lab up --gateways 2` (refused out of 1..8, naming
// the flag) gives each site gw and gw2; `lab hosts --gateways` lists both,
// the site map has a gateway record for gw2, $MPI5K_GATEWAYS in a lab host
// names both per site (what mpi5k run starts gateways from), and each
// gateway host reaches its site's nodes on the LAN and the other site's
// gateways on their WAN legs (--gateway-nics 2) over the emulated link.
func TestLabCLIGateways(t *testing.T) {
	labRequireRoot(t)
	bin, _ := testbed.Binary()
	name := "gw1"
	run := labCommand(t, bin)
	for _, bad := range []string{"0", "9", "-1", "two"} {
		out, err := exec.Command(bin, "lab", "up", "--name", name, "--gateways", bad).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--gateways") {
			t.Errorf("lab up --gateways %s: want an error naming --gateways, got %v: %s", bad, err, out)
		}
	}
	up := run("up", "--name", name, "--nodes", "1", "--gateways", "2", "--gateway-nics", "2", "--rtt", "10ms", "--wan-rate", "100mbit")
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "lab", "down", "--name", name).CombinedOutput(); err != nil {
			t.Errorf("lab down: %v %s", err, out)
		}
		labCheckGone(t, name)
	})
	if !strings.Contains(up, "2 gateway hosts per site: gw.site1, gw2.site1") {
		t.Errorf("lab up does not tell the gateway hosts:\n%s", up)
	}
	if got := run("hosts", "--name", name, "--gateways"); got != "node-1.site1\ngw.site1\ngw2.site1\nnode-1.site2\ngw.site2\ngw2.site2\n" {
		t.Errorf("hosts --gateways: %q", got)
	}
	if got := run("hosts", "--name", name); got != "node-1.site1\nnode-1.site2\n" {
		t.Errorf("hosts: %q", got)
	}
	sm, err := os.ReadFile(filepath.Join(testbed.RunDir, name, "sites.conf"))
	if err != nil || !strings.Contains(string(sm), "site site2 id=2 lan=10.77.2.2:5000 wan=10.78.2.2:5001\ngateway site2 lan=10.77.2.3:5000 wan=10.78.2.3:5001\n") {
		t.Errorf("site map: %v\n%s", err, sm)
	}
	out, err := exec.Command(bin, "lab", "exec", "--name", name, "gw2.site1", "--", "sh", "-c",
		`hostname; echo "$MPI5K_GATEWAYS"; getent hosts gw2-wan.site2`).CombinedOutput()
	want := "gw2.site1\nsite1=gw.site1,gw2.site1,site2=gw.site2,gw2.site2\n10.78.2.3       gw2-wan.site2\n"
	if err != nil || string(out) != want {
		t.Errorf("lab exec gw2.site1: %v\n%q\nwant\n%q", err, out, want)
	}
	l, err := testbed.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if p, err := l.Ping(ctx, "gw2.site1", "node-1.site1", 3, 5*time.Millisecond); err != nil || len(p) < 2 {
		t.Errorf("gw2.site1 -> node-1.site1 on the LAN: %v %v", p, err)
	}
	// Every gateway's WAN leg reaches every gateway of the other site
	// (the router must not mix up the legs of one site's gateways).
	for _, from := range l.Gateways("site1") {
		for _, to := range l.Gateways("site2") {
			for _, pair := range [][2]string{{from, to}, {to, from}} {
				p, err := l.PingAddr(ctx, pair[0], l.WANAddr(pair[1]), 5, 5*time.Millisecond)
				if err != nil || len(p) < 4 {
					t.Errorf("%s -> %s WAN leg %v: %v %v", pair[0], pair[1], l.WANAddr(pair[1]), p, err)
					continue
				}
				if med := labMedian(p); med < 9*time.Millisecond {
					t.Errorf("%s -> %s: rtt %v, want the emulated 10 ms", pair[0], pair[1], med)
				}
			}
		}
	}
	s, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if lk := s.Link("site1", "site2"); lk == nil || lk.Flow("icmp", l.WANAddr("gw2.site1").String(), l.WANAddr("gw2.site2").String()) == nil {
		t.Errorf("the gw2 WAN-leg ping is not seen on the site1->site2 link")
	}
}

// TestLabTwoLabsAndCrashCleanup: two labs with different names coexist;
// down after a crashed emulator still removes every namespace, process and
// file, including processes started inside lab hosts.
func TestLabTwoLabsAndCrashCleanup(t *testing.T) {
	labRequireRoot(t)
	a := labUp(t, testbed.Config{Nodes: 1, RTT: 6 * time.Millisecond, WANRate: 100e6})
	b := labUp(t, testbed.Config{Nodes: 1, RTT: 30 * time.Millisecond, WANRate: 100e6, Sites: []string{"lyon", "rennes", "nancy"}})
	ctx := context.Background()
	pa, err := a.Ping(ctx, "node-1.site1", "node-1.site2", 10, 5*time.Millisecond)
	if err != nil || len(pa) < 9 {
		t.Fatalf("lab a ping: %v %v", pa, err)
	}
	pb, err := b.Ping(ctx, "node-1.nancy", "node-1.rennes", 10, 5*time.Millisecond)
	if err != nil || len(pb) < 9 {
		t.Fatalf("lab b ping: %v %v", pb, err)
	}
	t.Logf("lab a rtt %v, lab b rtt %v", labMedian(pa), labMedian(pb))
	if labMedian(pa) > 10*time.Millisecond || labMedian(pb) < 25*time.Millisecond {
		t.Errorf("labs interfere: rtt %v (want ~6ms) and %v (want ~30ms)", labMedian(pa), labMedian(pb))
	}
	// A long-running process inside lab b, then a crash of its emulator.
	sleeper := b.Command("node-1.lyon", "sleep", "600")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sleeper.Wait() }()
	pidb, err := os.ReadFile(filepath.Join(testbed.RunDir, b.Name(), "emu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(pidb), &pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// Without its emulator the WAN stops (it is never bypassed).
	if p, _ := b.Ping(ctx, "node-1.lyon", "node-1.rennes", 3, 5*time.Millisecond); len(p) != 0 {
		t.Errorf("pings crossed the WAN without the emulator: %v", p)
	}
	if err := testbed.Down(b.Name()); err != nil {
		t.Fatal(err)
	}
	labCheckGone(t, b.Name())
	time.Sleep(100 * time.Millisecond)
	if err := syscall.Kill(sleeper.Process.Pid, 0); err == nil && !labZombie(fmt.Sprint(sleeper.Process.Pid)) {
		t.Errorf("process started in the lab (pid %d) survived down", sleeper.Process.Pid)
	}
	// Lab a is unaffected.
	if p, err := a.Ping(ctx, "node-1.site1", "node-1.site2", 5, 5*time.Millisecond); err != nil || len(p) < 4 {
		t.Errorf("lab a broken after lab b went down: %v %v", p, err)
	}
}

// TestLabCapacity finds the highest rate the emulator sustains here: one
// iperf3 TCP flow (20 ms RTT, -w 8M) per set rate and MTU, printing goodput,
// the share of the set rate, idle CPU and the emulator's lateness. A
// measurement, not a check: it only runs with MPI5K_LAB_CAPACITY=1
// (about 12 s per point), e.g.
//
//	MPI5K_LAB_CAPACITY=1 go test -count=1 -run TestLabCapacity -v ./e2e
func TestLabCapacity(t *testing.T) {
	labRequireRoot(t)
	if os.Getenv("MPI5K_LAB_CAPACITY") != "1" {
		t.Skip("capacity sweep: set MPI5K_LAB_CAPACITY=1 to run it")
	}
	points := []struct {
		rate uint64
		mtu  int
	}{{500e6, 1500}, {700e6, 1500}, {1e9, 1500}, {1e9, 9000}, {2e9, 9000}, {3e9, 9000}}
	for _, p := range points {
		l := labUp(t, testbed.Config{Nodes: 1, RTT: 20 * time.Millisecond, WANRate: p.rate, MTU: p.mtu})
		idle0, total0 := labCPU()
		got := labIperf(t, l, "node-1.site1", "node-1.site2", 5310, 8, "-w", "8M")
		idle1, total1 := labCPU()
		s, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		ls := s.Link("site1", "site2")
		t.Logf("CAPACITY rate %5.0f Mbit/s mtu %4d: goodput %6.1f Mbit/s (%5.1f%%), idle CPU %3.0f%%, late p50 %v p99 %v max %v, queue drops %d",
			float64(p.rate)/1e6, p.mtu, got/1e6, 100*got/float64(p.rate), 100*float64(idle1-idle0)/float64(total1-total0),
			ls.Late.P50, ls.Late.P99, ls.Late.Max, ls.QueueDrops)
		if err := testbed.Down(l.Name()); err != nil {
			t.Fatal(err)
		}
	}
}

// labCPU reads the machine's idle and total CPU jiffies.
func labCPU() (idle, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	for i, v := range f[1:] {
		var n uint64
		fmt.Sscan(v, &n)
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return idle, total
}

// labUDPCount sends count 200-byte UDP datagrams from host `from` to host
// `to`, one every 200 us, and returns how many arrived.
func labUDPCount(t *testing.T, l *testbed.Lab, from, to string, count int) int {
	seqs, _ := labUDPOrder(t, l, from, to, count)
	return len(seqs)
}

// labUDPOrder is labUDPCount returning the sequence numbers of the
// datagrams that arrived, in arrival order.
func labUDPOrder(t *testing.T, l *testbed.Lab, from, to string, count int) (seqs []int, warmups int) {
	t.Helper()
	var rc *net.UDPConn
	if err := l.Do(to, func() (err error) {
		rc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(l.Addr(to).AsSlice()), Port: 7009})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if raw, err := rc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 16<<20)
		})
	}
	var sc *net.UDPConn
	if err := l.Do(from, func() (err error) {
		sc, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IP(l.Addr(to).AsSlice()), Port: 7009})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	// Uncounted datagrams go first until one arrives: on a lossy LAN the
	// sender's ARP request or its reply may be lost, and the next try is
	// a second later, longer than the reader waits between datagrams (a
	// CI run counted 0 of 4000 on site1's 5 % LAN).
	const warmMark = 1<<32 - 1
	warm := make(chan struct{})
	got := make(chan []int, 1)
	go func() {
		buf := make([]byte, 2048)
		var seqs []int
		warmed := false
		for {
			wait := 500 * time.Millisecond
			if !warmed {
				wait = 5 * time.Second
			}
			_ = rc.SetReadDeadline(time.Now().Add(wait))
			n, err := rc.Read(buf)
			if err != nil {
				got <- seqs
				return
			}
			if n < 4 {
				continue
			}
			if q := binary.BigEndian.Uint32(buf); q != warmMark {
				seqs = append(seqs, int(q))
			} else if !warmed {
				warmed = true
				close(warm)
			}
		}
	}()
	msg := make([]byte, 200)
	binary.BigEndian.PutUint32(msg, warmMark)
	giveUp := time.After(10 * time.Second)
	for warmed := false; !warmed; {
		if _, err := sc.Write(msg); err != nil {
			t.Fatal(err)
		}
		warmups++
		select {
		case <-warm:
			warmed = true
		case <-giveUp:
			t.Fatalf("no datagram from %s reached %s in 10 s", from, to)
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := 0; i < count; i++ {
		binary.BigEndian.PutUint32(msg, uint32(i))
		if _, err := sc.Write(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return <-got, warmups
}

// overtaken counts the datagrams that arrived after one sent later, and
// checks that each of 0..count-1 arrived exactly once.
func overtaken(t *testing.T, what string, seqs []int, count int) int {
	t.Helper()
	seen := make([]int, count)
	late, highest := 0, -1
	for _, q := range seqs {
		if q < 0 || q >= count {
			t.Fatalf("%s: datagram %d was never sent", what, q)
		}
		seen[q]++
		if q < highest {
			late++
		}
		highest = max(highest, q)
	}
	for q, n := range seen {
		if n != 1 {
			t.Errorf("%s: datagram %d arrived %d times", what, q, n)
		}
	}
	return late
}

// TestLabLANLoss (issue 32, the lab part): --lan-loss site1=5% drops about
// 5 % of the frames on site1's LAN, on the path between a node and its
// gateway and on the router's delivery into the site from the WAN, and
// nothing on site2's LAN; the LAN counters in the lab's stats agree.
func TestLabLANLoss(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 2 * time.Millisecond, WANRate: 1e9,
		SiteLANLoss: map[string]float64{"site1": 0.05}})
	const count = 4000
	// Binomial(4000, 0.05): mean 200 lost, sd 14; the bounds are 5 sd.
	check := func(what string, got int, lossy bool) {
		lost := count - got
		t.Logf("%s: %d of %d arrived, %d lost", what, got, count, lost)
		switch {
		case lossy && (lost < 130 || lost > 270):
			t.Errorf("%s: %d of %d lost, want about 200 (5 %% LAN loss)", what, lost, count)
		case !lossy && lost != 0:
			t.Errorf("%s: %d of %d lost on a path without loss", what, lost, count)
		}
	}
	before, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	check("node-1.site1 -> gw.site1 (site1's LAN)", labUDPCount(t, l, "node-1.site1", "gw.site1", count), true)
	check("node-1.site2 -> gw.site2 (site2's LAN)", labUDPCount(t, l, "node-1.site2", "gw.site2", count), false)
	check("node-1.site2 -> node-1.site1 (into site1 from the WAN)", labUDPCount(t, l, "node-1.site2", "node-1.site1", count), true)
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.LANs) != 1 || st.LANs[0].Site != "site1" || st.LANs[0].Loss != 0.05 {
		t.Fatalf("LAN stats %+v, want site1 alone at 5 %%", st.LANs)
	}
	var dropped0 uint64
	if len(before.LANs) == 1 {
		dropped0 = before.LANs[0].Drops
	}
	ln := st.LANs[0]
	t.Logf("site1's LAN: %d frames, %d dropped", ln.Frames, ln.Drops)
	if d := ln.Drops - dropped0; d < 260 || ln.Frames < 2*count {
		t.Errorf("site1's LAN counted %d frames and %d drops during two lossy runs of %d", ln.Frames, d, count)
	}
}

// TestLabLANReorder (issue 32, the lab part): --lan-reorder site1=10% holds
// about 10 % of the IPv4 packets entering site1's LAN back 5 ms: datagrams
// from a node to its gateway all arrive once, about 10 % after later ones;
// on site2's LAN none is overtaken; packets held on their way out of site1
// still cross the emulated WAN (the lab's policy routing takes them there),
// all of them, once.
func TestLabLANReorder(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 2 * time.Millisecond, WANRate: 1e9,
		SiteLANReorder: map[string]float64{"site1": 0.1}})
	const count = 4000
	// Binomial(4000, 0.1): mean 400, sd 19; the bounds are 6 sd.
	seqs, _ := labUDPOrder(t, l, "node-1.site1", "gw.site1", count)
	lan := overtaken(t, "node-1.site1 -> gw.site1", seqs, count)
	t.Logf("site1's LAN: %d of %d datagrams arrived after later ones", lan, count)
	if lan < 285 || lan > 515 {
		t.Errorf("site1's LAN: %d of %d datagrams overtaken, want about 400 (10 %% held back 5 ms)", lan, count)
	}
	before, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	seqs, warmups := labUDPOrder(t, l, "node-1.site1", "node-1.site2", count)
	wan := overtaken(t, "node-1.site1 -> node-1.site2", seqs, count)
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	f, f0 := st.Link("site1", "site2").Flow("udp", l.Addr("node-1.site1").String()+":", l.Addr("node-1.site2").String()+":7009"), before.Link("site1", "site2").Flow("udp", l.Addr("node-1.site1").String()+":", "")
	var crossed uint64
	if f != nil {
		crossed = f.Packets
		if f0 != nil && f0.Dst == f.Dst && f0.Src == f.Src {
			crossed -= f0.Packets
		}
	}
	t.Logf("site1 -> site2: %d overtaken; %d datagrams crossed the emulated WAN: the %d counted and %d uncounted first ones", wan, crossed, count, warmups)
	if crossed != uint64(count+warmups) {
		t.Errorf("%d of %d datagrams (and %d uncounted first ones) crossed the emulated WAN: held ones must not bypass it", crossed, count, warmups)
	}
	if wan < 285 || wan > 515 {
		t.Errorf("site1 -> site2: %d of %d overtaken, want about 400", wan, count)
	}
	if len(st.LANs) != 1 || st.LANs[0].Site != "site1" || st.LANs[0].Reorder != 0.1 || st.LANs[0].ReorderDelay != testbed.DefaultReorderDelay {
		t.Fatalf("LAN stats %+v, want site1 alone, reordering 10 %% by %v", st.LANs, testbed.DefaultReorderDelay)
	}
	if held := st.LANs[0].Held; held < uint64(lan+wan) || held > uint64(lan+wan)+40 {
		t.Errorf("site1's LAN held %d packets back, %d datagrams were overtaken", held, lan+wan)
	}
}
