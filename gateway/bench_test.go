package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"

	"golang.org/x/sys/unix"
)

// The benchmarks run each gateway in its own process (this test binary
// re-executed with MPI5K_GW_CHILD set), as in production, so that its CPU
// time can be read from /proc and it does not share a Go scheduler with the
// load generator.

func TestMain(m *testing.M) {
	if spec := os.Getenv("MPI5K_GW_CHILD"); spec != "" {
		os.Exit(childGateway(spec))
	}
	if spec := os.Getenv("MPI5K_COPY_CHILD"); spec != "" {
		// A minimal forwarder process: "listen,to[,epoll|raw-epoll|raw-blocking]".
		f := strings.Split(spec, ",")
		if len(f) > 2 && strings.HasPrefix(f[2], "raw-") {
			serveRaw(netip.MustParseAddrPort(f[0]), netip.MustParseAddrPort(f[1]), strings.TrimPrefix(f[2], "raw-"))
			os.Exit(0)
		}
		ln, err := net.Listen("tcp", f[0])
		if err != nil {
			os.Exit(1)
		}
		if len(f) > 2 && f[2] == "epoll" {
			serveEpoll(ln.(*net.TCPListener), netip.MustParseAddrPort(f[1]))
		} else {
			serveCopy(ln.(*net.TCPListener), netip.MustParseAddrPort(f[1]))
		}
		os.Exit(0)
	}
	if spec := os.Getenv("MPI5K_SCALE_DST"); spec != "" {
		os.Exit(scaleDstChild(spec))
	}
	if spec := os.Getenv("MPI5K_SCALE_CLIENTS"); spec != "" {
		os.Exit(scaleClientChild(spec))
	}
	if spec := os.Getenv("MPI5K_SCALE_DST_MX"); spec != "" {
		os.Exit(scaleDstMXChild(spec))
	}
	if spec := os.Getenv("MPI5K_SCALE_CLIENTS_MX"); spec != "" {
		os.Exit(scaleClientMXChild(spec))
	}
	if addr := os.Getenv("MPI5K_ECHO_CHILD"); addr != "" {
		serveEchoProc(netip.MustParseAddrPort(addr))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveEchoProc echoes each connection accepted on addr with blocking read
// and write on a locked OS thread, with sockets the Go runtime never sees
// (see serveRaw), as a C echo server does.
func serveEchoProc(addr netip.AddrPort) {
	ln := rawListen(addr)
	rawRuntime()
	for {
		c, err := rawAccept(ln)
		if err != nil {
			return
		}
		unix.SetsockoptInt(c, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		go func() {
			runtime.LockOSThread()
			buf := make([]byte, 64<<10)
			for forward(c, c, buf) {
			}
			unix.Close(c)
		}()
	}
}

// diesWithParent kills a benchmark's child process when the benchmark
// dies without running its cleanups (interrupted, timed out): orphaned
// gateways and forwarders would otherwise keep waking up and skew every
// later measurement on the machine.
var diesWithParent = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

// echoProc starts an echo server in its own process on addr.
func echoProc(b testing.TB, addr netip.Addr) netip.AddrPort {
	p := netip.AddrPortFrom(addr, freePort(b, addr))
	startChild(b, "MPI5K_ECHO_CHILD="+p.String(), p)
	return p
}

// startChild re-executes this test binary with env set (one of the child
// modes of TestMain) and waits until it accepts connections on p.
func startChild(b testing.TB, env string, p netip.AddrPort) {
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), env)
	c.SysProcAttr = diesWithParent
	if err := c.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Process.Kill(); c.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", p.String()); err == nil {
			c.Close()
			return
		}
		if i > 200 {
			b.Fatalf("child %s did not start", env)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// childGateway runs one gateway: spec is "mapfile,site,readyfile".
func childGateway(spec string) int {
	f := strings.Split(spec, ",")
	m, err := sitemap.Load(f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The gateway's flags follow "--" on the command line (startChildren).
	var flags []string
	if i := slices.Index(os.Args, "--"); i >= 0 {
		flags = os.Args[i+1:]
	}
	cfg, err := testConfig(m, f[1], flags...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.ReadyFile = f[2]
	if len(f) > 3 && f[3] != "" {
		cfg.KeyFile = f[3] // a keyed map (startChildrenMap)
	}
	if len(f) > 5 { // which of the site's gateway hosts (startGatewayChild)
		cfg.ListenLAN, cfg.ListenWAN = netip.MustParseAddrPort(f[4]), netip.MustParseAddrPort(f[5])
	}
	if v := os.Getenv("MPI5K_GW_LAN_MX"); v != "" { // BenchmarkScaleHub's MX LAN
		if err := scaleHubMX(&cfg, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if v := os.Getenv("MPI5K_GW_MEMSTATS"); v != "" {
		childMemStats(v)
	}
	if dir := os.Getenv("MPI5K_GW_CPUPROFILE"); dir != "" {
		// One profile per gateway and run, written when it stops.
		p, err := os.CreateTemp(dir, f[1]+"-*.pprof")
		if err == nil && pprof.StartCPUProfile(p) == nil {
			defer p.Close()
			defer pprof.StopCPUProfile()
		}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	g.Run(ctx)
	return 0
}

type childPair struct {
	m    *sitemap.Map
	a, b *exec.Cmd
}

// startChildren starts gateways a and b, each in a process of its own,
// with mpi5k-gateway flags: those given, then $MPI5K_GW_FLAGS (e.g.
// MPI5K_GW_FLAGS=--poll-thread=false for every benchmark).
func startChildren(b testing.TB, flags ...string) *childPair {
	b.Helper()
	return startChildrenMap(b, testMap(b), nil, flags...)
}

// startChildrenMap is startChildren with map m and, for a keyed map, each
// site's key file.
func startChildrenMap(b testing.TB, m *sitemap.Map, keyFiles map[string]string, flags ...string) *childPair {
	flags = append(flags, strings.Fields(os.Getenv("MPI5K_GW_FLAGS"))...)
	b.Helper()
	dir := b.TempDir()
	mp := filepath.Join(dir, "sites.conf")
	f, _ := os.Create(mp)
	m.WriteTo(f)
	f.Close()
	cp := &childPair{m: m}
	for _, site := range []string{"a", "b"} {
		c := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, flags...)...)
		spec := mp + "," + site + "," + filepath.Join(dir, site+".ready")
		if keyFiles != nil {
			spec += "," + keyFiles[site]
		}
		c.Env = append(os.Environ(), "MPI5K_GW_CHILD="+spec)
		c.Stderr = os.Stderr
		c.SysProcAttr = diesWithParent
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Process.Signal(syscall.SIGTERM); c.Wait() })
		if site == "a" {
			cp.a = c
		} else {
			cp.b = c
		}
	}
	for _, site := range []string{"a", "b"} {
		for i := 0; ; i++ {
			if _, err := os.Stat(filepath.Join(dir, site+".ready")); err == nil {
				break
			}
			if i > 500 {
				b.Fatal("child gateways did not become ready")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return cp
}

func (cp *childPair) lan(site string) netip.AddrPort {
	s, _ := cp.m.Site(site)
	return s.LAN
}

// cpuTime is the user+system time of process pid.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ = 100
}

func echoServer(c *net.TCPConn) {
	defer c.Close()
	io.Copy(c, c)
}

// socatChain starts two socat relays (one per "site gateway") in front of
// dst and returns the first one's address.
func socatChain(b testing.TB, dst netip.AddrPort) netip.AddrPort {
	if _, err := exec.LookPath("socat"); err != nil {
		b.Skip("socat not installed")
	}
	p2 := netip.AddrPortFrom(gwB, freePort(b, gwB))
	p1 := netip.AddrPortFrom(gwA, freePort(b, gwA))
	for _, hop := range [][2]netip.AddrPort{{p2, dst}, {p1, p2}} {
		c := exec.Command("socat", fmt.Sprintf("TCP-LISTEN:%d,bind=%s,reuseaddr,fork,nodelay", hop[0].Port(), hop[0].Addr()),
			fmt.Sprintf("TCP:%s,nodelay", hop[1]))
		c.SysProcAttr = diesWithParent
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
		for i := 0; ; i++ {
			if c, err := net.Dial("tcp", hop[0].String()); err == nil {
				c.Close()
				break
			}
			if i > 200 {
				b.Fatal("socat did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return p1
}

func pingPong(b *testing.B, c *net.TCPConn) {
	buf := make([]byte, 1)
	c.SetNoDelay(true)
	roundTrips(b, func() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	})
}

// roundTrips times b.N calls of rt after 100 unmeasured ones (connection
// setup, first OPEN, page faults) and reports their p50 and p99.
// MPI5K_PP_GAP (a duration, "20ms") pauses before each timed round trip,
// as a latency-bound code waits a WAN round trip between messages: the
// relays have gone idle when each message arrives.
func roundTrips(b *testing.B, rt func()) {
	var gap time.Duration
	if v := os.Getenv("MPI5K_PP_GAP"); v != "" {
		var err error
		if gap, err = time.ParseDuration(v); err != nil {
			b.Fatalf("MPI5K_PP_GAP=%q: want a duration such as 20ms", v)
		}
	}
	for range 100 {
		rt()
	}
	lat := make([]time.Duration, 0, b.N)
	cpu0 := childrenCPU()
	b.ResetTimer()
	for b.Loop() {
		if gap > 0 {
			time.Sleep(gap)
		}
		t := time.Now()
		rt()
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	cpu := childrenCPU() - cpu0
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
	// What the relays (and an echo process) spend on a round trip, apart
	// from how long their wake-ups take: the row minus direct is the
	// relays' own work.
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(len(lat)), "child-cpu-us/op")
}

// childrenCPU is the CPU time of every live descendant of this process
// (gateways, forwarders, socat and the processes it forks, an echo
// process), summed over their threads from schedstat (nanoseconds).
func childrenCPU() time.Duration {
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		parent[pid], _ = strconv.Atoi(f[1])
	}
	self := os.Getpid()
	var sum time.Duration
	for pid := range parent {
		p := parent[pid]
		for p > 1 && p != self {
			p = parent[p]
		}
		if p != self {
			continue
		}
		sum += threadsCPU(pid)
	}
	return sum
}

// threadsCPU is the CPU time (user + system, nanoseconds from schedstat)
// of the live threads of process pid.
func threadsCPU(pid int) time.Duration {
	var sum time.Duration
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		if st, err := os.ReadFile(t); err == nil {
			if ns, err := strconv.ParseInt(strings.Fields(string(st))[0], 10, 64); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	return sum
}

// threadsSwitches is the number of voluntary context switches of the live
// threads of process pid: each is a thread going to sleep, so a count per
// second is the process's wake-ups.
func threadsSwitches(pid int) int64 {
	var sum int64
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		st, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				sum += n
			}
		}
	}
	return sum
}

// idleCPUWindow is how long BenchmarkIdleCPU measures per iteration:
// USER_HZ does not matter (schedstat counts nanoseconds), but a ping a
// second and 100 ms samplers need several seconds to average out.
var idleCPUWindow = 10 * time.Second

// BenchmarkIdleCPU: the CPU each gateway of a pair uses with its WAN
// links up and no streams (idle), and the same while a foreign TCP flow
// saturates the path between the gateways' addresses beside the idle
// links (foreign-flow). On loopback the foreign flow shares the cores, not
// a bottleneck: the links' RTT and their queue control see nothing of it.
// bench/idlecpu.sh measures the same on the lab's emulated WAN, where the
// flow and the links share a 200 Mbit/s bottleneck. Run with
// -benchtime 1x (each iteration lasts idleCPUWindow).
func BenchmarkIdleCPU(b *testing.B) {
	for _, foreign := range []bool{false, true} {
		name := "idle"
		if foreign {
			name = "foreign-flow"
		}
		b.Run(name, func(b *testing.B) {
			cp := startChildren(b)
			// Priming and the first samples are done well within this.
			time.Sleep(time.Second)
			if foreign {
				stop := foreignFlow(b, gwA, gwB)
				defer stop()
			}
			pids := []int{cp.a.Process.Pid, cp.b.Process.Pid}
			cpu0 := []time.Duration{threadsCPU(pids[0]), threadsCPU(pids[1])}
			sw0 := []int64{threadsSwitches(pids[0]), threadsSwitches(pids[1])}
			start := time.Now()
			for b.Loop() {
				time.Sleep(idleCPUWindow)
			}
			el := time.Since(start)
			for i, site := range []string{"a", "b"} {
				cpu := threadsCPU(pids[i]) - cpu0[i]
				b.ReportMetric(100*cpu.Seconds()/el.Seconds(), "%core-"+site)
				b.ReportMetric(float64(threadsSwitches(pids[i])-sw0[i])/el.Seconds(), "wakeups/s-"+site)
			}
		})
	}
}

// foreignFlow sends as fast as it can from an address of from to a sink
// on to, both outside the gateways, until stop.
func foreignFlow(b testing.TB, from, to netip.Addr) (stop func()) {
	return bulkFlow(b, to, func(sink netip.AddrPort) (*net.TCPConn, error) {
		return net.DialTCP("tcp", &net.TCPAddr{IP: from.AsSlice()}, net.TCPAddrFromAddrPort(sink))
	})
}

// bulkFlow sends as fast as it can on the connection dial makes to a sink
// on to, until stop.
func bulkFlow(b testing.TB, to netip.Addr, dial func(sink netip.AddrPort) (*net.TCPConn, error)) (stop func()) {
	sink := testnet.Serve(b, to, func(c *net.TCPConn) { io.Copy(io.Discard, c); c.Close() })
	c, err := dial(sink)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<20)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	return func() { c.Close(); <-done }
}

// BenchmarkPingPong: 1-byte round trip (a) directly, through the gateway
// pair, and through a chain of two socat relays, on the same loopback path.
func BenchmarkPingPong(b *testing.B) {
	// The echo server runs in this process, where Go's runtime hands the
	// byte between client and server without a process wake-up: the
	// cheapest direct path, so every relay's cost shows in full.
	// MPI5K_ECHO=proc runs it in a process of its own instead, as a remote
	// rank is (bench/figures/pollthread).
	dst := testnet.Serve(b, nodeB, echoServer)
	if os.Getenv("MPI5K_ECHO") == "proc" {
		dst = echoProc(b, nodeB)
	}
	// via dials the first hop: a gateway's LAN side (with the OPEN the shim
	// sends) or a plain forwarder.
	gw := func(lan netip.AddrPort) (*net.TCPConn, error) { return lanOpen(lan, nodeA, dst) }
	plain := func(p netip.AddrPort) (*net.TCPConn, error) {
		return net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, net.TCPAddrFromAddrPort(p))
	}
	// inproc: the row's relays run in this process, so the client must
	// not block where the runtime cannot stop it (rawPingPong).
	for _, r := range []struct {
		name   string
		inproc bool
		via    func(b *testing.B) (*net.TCPConn, error)
	}{
		{"direct", false, func(b *testing.B) (*net.TCPConn, error) { return plain(dst) }},
		{"gateway", false, func(b *testing.B) (*net.TCPConn, error) { return gw(startChildren(b).lan("a")) }},
		// The same pair with Go's runtime woken by every arriving byte as
		// well (--quiet-runtime=false).
		{"gateway-runtime-wakes", false, func(b *testing.B) (*net.TCPConn, error) {
			return gw(startChildren(b, "--quiet-runtime=false").lan("a"))
		}},
		// The same pair waiting in Go's network poller (--poll-thread=false).
		{"gateway-go-poller", false, func(b *testing.B) (*net.TCPConn, error) {
			return gw(startChildren(b, "--poll-thread=false").lan("a"))
		}},
		// Both gateways in this process (one poller thread for both).
		{"gateway-inproc", true, func(b *testing.B) (*net.TCPConn, error) {
			_, a, _ := startPair(b, nil)
			return gw(a.LANAddr())
		}},
		// Without the poller thread the whole round trip runs on this
		// process's threads without sleeping: the gateways' own cost.
		{"gateway-inproc-go-poller", true, func(b *testing.B) (*net.TCPConn, error) {
			_, a, _ := startPair(b, func(c *Config) { c.PollThread = false })
			return gw(a.LANAddr())
		}},
		// Floor of a Go relay: two plain read/write forwarders (a goroutine
		// per direction), no framing, no multiplexing, in this process...
		{"go-copy-chain-inproc", true, func(b *testing.B) (*net.TCPConn, error) { return plain(goChain(b, dst, false, "")) }},
		// ... and each in its own process.
		{"go-copy-chain", false, func(b *testing.B) (*net.TCPConn, error) { return plain(goChain(b, dst, true, "")) }},
		// The floor of a relay process on this machine: two forwarders that
		// each wait in epoll_wait on one locked thread and read and write
		// right there, as a C event loop does (and the gateway's poller
		// thread). No framing, no multiplexing.
		{"go-epoll-chain", false, func(b *testing.B) (*net.TCPConn, error) { return plain(goChain(b, dst, true, "epoll")) }},
		// The same two forwarders, and two that block in read(2), with
		// sockets the Go runtime never sees (serveRaw): the floor of a relay
		// process, Go or C, on this machine.
		{"raw-epoll-chain", false, func(b *testing.B) (*net.TCPConn, error) { return plain(goChain(b, dst, true, "raw-epoll")) }},
		{"raw-blocking-chain", false, func(b *testing.B) (*net.TCPConn, error) { return plain(goChain(b, dst, true, "raw-blocking")) }},
		{"socat", false, func(b *testing.B) (*net.TCPConn, error) { return plain(socatChain(b, dst)) }},
		// No relay process at all: the kernel forwards (sockmap), the
		// floor of any relay pair on this machine.
		{"sockmap-chain", false, func(b *testing.B) (*net.TCPConn, error) {
			first, ready := sockmapChain(b, dst)
			c, err := plain(first)
			if err == nil {
				ready()
			}
			return c, err
		}},
	} {
		b.Run(r.name, func(b *testing.B) {
			c, err := r.via(b)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if os.Getenv("MPI5K_RAWCLIENT") != "" {
				rawPingPong(b, c, !r.inproc && os.Getenv("MPI5K_ECHO") == "proc")
				return
			}
			pingPong(b, c)
		})
	}
}

// BenchmarkForward: (c) one bulk stream through the pair, unthrottled;
// reports the rate per CPU-second of gateway a (the sender side) and b.
func BenchmarkForward(b *testing.B) {
	for _, chunk := range []string{"64KiB", "128KiB", "256KiB"} {
		b.Run("chunk="+chunk, func(b *testing.B) {
			cp := startChildren(b, "--chunk="+chunk)
			done := make(chan int64, 1)
			dst := testnet.Serve(b, nodeB, func(c *net.TCPConn) { n, _ := io.Copy(io.Discard, c); done <- n })
			c, err := lanOpen(cp.lan("a"), nodeA, dst)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			ca, cb := cpuTime(cp.a.Process.Pid), cpuTime(cp.b.Process.Pid)
			start := time.Now()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.CloseWrite()
			n := <-done
			el := time.Since(start)
			c.Close()
			da, db := cpuTime(cp.a.Process.Pid)-ca, cpuTime(cp.b.Process.Pid)-cb
			b.ReportMetric(float64(n)*8/el.Seconds()/1e9, "Gbit/s")
			if da > 0 && db > 0 {
				b.ReportMetric(float64(n)*8/da.Seconds()/1e9, "Gbit/s-per-core-a")
				b.ReportMetric(float64(n)*8/db.Seconds()/1e9, "Gbit/s-per-core-b")
			}
		})
	}
	b.Run("direct", func(b *testing.B) {
		done := make(chan int64, 1)
		dst := testnet.Serve(b, nodeB, func(c *net.TCPConn) { n, _ := io.Copy(io.Discard, c); done <- n })
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, net.TCPAddrFromAddrPort(dst))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		b.SetBytes(int64(len(buf)))
		start := time.Now()
		for b.Loop() {
			c.Write(buf)
		}
		c.CloseWrite()
		n := <-done
		c.Close()
		b.ReportMetric(float64(n)*8/time.Since(start).Seconds()/1e9, "Gbit/s")
	})
}

// goChain starts two minimal forwarders in front of dst, in this process or
// (separate) each in its own process like the gateways and socat.
func goChain(b testing.TB, dst netip.AddrPort, separate bool, mode string) netip.AddrPort {
	next := dst
	for _, a := range []netip.Addr{gwB, gwA} {
		if separate {
			p := netip.AddrPortFrom(a, freePort(b, a))
			startChild(b, "MPI5K_COPY_CHILD="+p.String()+","+next.String()+","+mode, p)
			next = p
			continue
		}
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: a.AsSlice()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		go serveCopy(ln, next)
		next = ln.Addr().(*net.TCPAddr).AddrPort()
	}
	return next
}

// forwardEach accepts connections on ln until it closes and hands each,
// with a new connection to "to", to forward.
func forwardEach(ln *net.TCPListener, to netip.AddrPort, forward func(c, d *net.TCPConn)) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		d, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(to))
		if err != nil {
			c.Close()
			continue
		}
		forward(c, d)
	}
}

func serveCopy(ln *net.TCPListener, to netip.AddrPort) {
	forwardEach(ln, to, func(c, d *net.TCPConn) {
		pump := func(dst, src *net.TCPConn) {
			buf := make([]byte, 64<<10)
			for {
				n, err := src.Read(buf)
				if err != nil {
					dst.CloseWrite()
					return
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
		}
		go pump(d, c)
		go pump(c, d)
	})
}

// serveEpoll forwards each accepted connection to "to" like serveCopy, but
// with one locked OS thread per process that waits in epoll_wait for every
// socket and reads and writes right after (blocking writes: a 1-byte
// ping-pong never fills a socket).
func serveEpoll(ln *net.TCPListener, to netip.AddrPort) {
	ep, err := unix.EpollCreate1(0)
	if err != nil {
		os.Exit(1)
	}
	var mu sync.Mutex
	peer := map[int32]int{} // fd -> fd it forwards to
	var keep []any
	go func() {
		runtime.LockOSThread()
		evs := make([]unix.EpollEvent, 16)
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.EpollWait(ep, evs, -1)
			if err != nil {
				continue
			}
			for _, ev := range evs[:n] {
				mu.Lock()
				dst, ok := peer[ev.Fd]
				mu.Unlock()
				if !ok {
					continue
				}
				k, err := unix.Read(int(ev.Fd), buf)
				if k <= 0 && err != unix.EAGAIN {
					unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
					unix.Shutdown(dst, unix.SHUT_WR)
					continue
				}
				for off := 0; off < k; {
					w, err := unix.Write(dst, buf[off:k])
					if err != nil && err != unix.EAGAIN {
						break
					}
					off += max(w, 0)
				}
			}
		}
	}()
	forwardEach(ln, to, func(c, d *net.TCPConn) {
		// File() dups each socket (the dup is blocking; the originals stay
		// open, unused, so the descriptors stay valid).
		fc, _ := c.File()
		fd, _ := d.File()
		a, b := int32(fc.Fd()), int32(fd.Fd())
		mu.Lock()
		keep = append(keep, c, d, fc, fd) // finalizers would close them
		peer[a], peer[b] = int(b), int(a)
		mu.Unlock()
		for _, x := range []int32{a, b} {
			unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, int(x), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: x})
		}
	})
}

// rawListen opens a listening socket with raw system calls, so that the Go
// runtime never registers it, or the sockets accepted from it, in its own
// epoll set (see serveRaw).
func rawListen(p netip.AddrPort) int {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		os.Exit(1)
	}
	unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if unix.Bind(ln, sockaddr4(p)) != nil || unix.Listen(ln, 16) != nil {
		os.Exit(1)
	}
	return ln
}

func sockaddr4(p netip.AddrPort) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Port: int(p.Port()), Addr: p.Addr().As4()}
}

// rawAccept accepts the next connection on ln, retrying only an
// interrupted call; any other error ends the caller's accept loop, as a
// closed listener ends forwardEach's.
func rawAccept(ln int) (int, error) {
	for {
		c, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
		if err != unix.EINTR {
			return c, err
		}
	}
}

// serveRaw forwards each connection accepted on listen to "to", like
// serveCopy and serveEpoll, but with sockets the Go runtime never sees.
// Every socket made through package net sits in the runtime's epoll set, and
// while the process has a timer or a goroutine waiting for a socket, one
// runtime thread sleeps in that set: each arriving byte wakes it as well as
// the thread that reads the byte. These forwarders pay only the wake-up of
// the thread that reads: with mode "blocking" one locked thread per
// direction blocks in read(2), the simplest C relay; with "epoll" one locked
// thread waits in epoll_wait for every socket, as a C event loop and the
// gateway's poller thread do.
func serveRaw(listen, to netip.AddrPort, mode string) {
	ln := rawListen(listen)
	rawRuntime()
	var add func(a, b int)
	if mode == "epoll" {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			os.Exit(1)
		}
		var mu sync.Mutex
		peer := map[int32]int{}
		go func() {
			runtime.LockOSThread()
			evs := make([]unix.EpollEvent, 16)
			buf := make([]byte, 64<<10)
			for {
				n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), ^uintptr(0), 0, 0)
				if e != 0 {
					continue
				}
				for _, ev := range evs[:n] {
					mu.Lock()
					dst := peer[ev.Fd]
					mu.Unlock()
					if !forward(int(ev.Fd), dst, buf) {
						unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
					}
				}
			}
		}()
		add = func(a, b int) {
			mu.Lock()
			peer[int32(a)], peer[int32(b)] = b, a
			mu.Unlock()
			for _, x := range []int{a, b} {
				unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, x, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(x)})
			}
		}
	} else {
		pump := func(src, dst int) {
			runtime.LockOSThread()
			buf := make([]byte, 64<<10)
			for forward(src, dst, buf) {
			}
		}
		add = func(a, b int) {
			go pump(a, b)
			go pump(b, a)
		}
	}
	runtime.LockOSThread()
	for {
		c, err := rawAccept(ln)
		if err != nil {
			return
		}
		d, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			err = unix.Connect(d, sockaddr4(to))
		}
		if err != nil {
			unix.Close(c)
			continue
		}
		for _, fd := range []int{c, d} {
			unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		}
		add(c, d)
	}
}

// rawRuntime readies this process for threads that block in raw system
// calls, which keep the runtime out of every wake-up: such a thread keeps
// its P while it blocks, so there must be Ps enough for every thread, and no
// collection (which would wait for them) may start.
func rawRuntime() {
	runtime.GOMAXPROCS(64)
	debug.SetGCPercent(-1)
}

func rawRW(nr uintptr, fd int, b []byte) int {
	n, _, e := unix.RawSyscall(nr, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return -1
	}
	return int(n)
}

// forward reads what src has (blocking until it has something) and writes
// all of it to dst; false at end of file or on an error.
func forward(src, dst int, buf []byte) bool {
	n := rawRW(unix.SYS_READ, src, buf)
	if n <= 0 {
		unix.Shutdown(dst, unix.SHUT_WR)
		return false
	}
	for off := 0; off < n; {
		w := rawRW(unix.SYS_WRITE, dst, buf[off:n])
		if w < 0 {
			return false
		}
		off += w
	}
	return true
}

// rawPingPong is pingPong with the client blocking in read(2) on a
// duplicate of c, with c closed so that the Go runtime no longer watches the
// socket, as a C rank's (MPI5K_RAWCLIENT=1): Go's poller then adds no
// wake-ups of its own to the client's side of every row.
//
// alone: nothing the round trip needs runs in this process, so the calls
// can be raw, as the raw forwarders' are. Through syscall.Syscall every
// blocking read entered a system call that sysmon, finding its P held
// longer than 20 us, retook, which kept sysmon waking every 20 us (4,900
// wake-ups and 2,800 futex calls a second in this process, on the 2 vCPUs
// every row's hops need), where a C rank costs nothing while it waits. A
// raw call cannot be stopped, so no collection may start meanwhile, and
// with relays in this process any stop of the world (a collection, the
// poller's GOMAXPROCS change) would wait for a read that waits for them.
func rawPingPong(b *testing.B, c *net.TCPConn, alone bool) {
	c.SetNoDelay(true)
	rc, _ := c.SyscallConn()
	fd := -1
	rc.Control(func(x uintptr) { fd, _ = unix.Dup(int(x)) })
	// Closing c takes the socket out of the runtime's epoll set; the
	// duplicate keeps it open.
	c.Close()
	unix.SetNonblock(fd, false)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer unix.Close(fd)
	buf := make([]byte, 1)
	if alone {
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
	}
	// one reads or writes the byte (direct calls, so buf stays put).
	one := func(nr uintptr) (uintptr, unix.Errno) {
		if alone {
			n, _, e := unix.RawSyscall(nr, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), 1)
			return n, e
		}
		n, _, e := unix.Syscall(nr, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), 1)
		return n, e
	}
	roundTrips(b, func() {
		if n, e := one(unix.SYS_WRITE); n != 1 {
			b.Fatalf("write to the ping-pong socket: %v", e)
		}
		if n, e := one(unix.SYS_READ); n != 1 {
			b.Fatalf("read from the ping-pong socket returned %d: %v", int(n), e)
		}
	})
}
