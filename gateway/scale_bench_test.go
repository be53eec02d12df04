package gateway

import (
	"context"
	"fmt"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Scale benchmarks (issue 33): one gateway with the most peers a site map
// allows and many idle streams, and a restarted site rejoining a 64-site
// mesh. Everything runs on loopback; see bench/figures/scale/README.md.
//
//	flock /tmp/mpi5k-heavy.lock go test -run '^$' -bench 'Scale|Rejoin' -benchtime 1x ./gateway
//
// MPI5K_SCALE_STREAMS sets the idle stream count (default 16000);
// MPI5K_SCALE_LAN=mx puts the LANs on MX (scale_mx_bench_test.go).

// raiseNoFile lifts RLIMIT_NOFILE to need, raising the hard limit too when
// allowed (CAP_SYS_RESOURCE; up to fs.nr_open), and skips the benchmark if
// it cannot. Children inherit it.
func raiseNoFile(b *testing.B, need uint64) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		b.Fatal(err)
	}
	if r.Cur >= need {
		return
	}
	lim := uint64(1 << 20)
	if v, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		lim, _ = strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64)
	}
	r.Cur, r.Max = min(need, lim), max(r.Max, min(need, lim))
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		b.Skipf("cannot raise RLIMIT_NOFILE to %d (%v): run as root", need, err)
	}
	if r.Cur < need {
		b.Skipf("RLIMIT_NOFILE can only reach %d, need %d", r.Cur, need)
	}
}

// hubMem is what the hub child reports after a forced GC and returning
// freed memory to the OS (childMemStats), plus its RSS.
type hubMem struct {
	heapInuse, stackInuse, sys, goroutines, rss uint64
}

// memOf asks the hub child (SIGUSR1) for its memory and reads its RSS.
func memOf(b *testing.B, c *exec.Cmd, file string) hubMem {
	os.Remove(file)
	if err := c.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	var m hubMem
	for i := 0; ; i++ {
		if v, err := os.ReadFile(file); err == nil {
			fmt.Sscan(string(v), &m.heapInuse, &m.stackInuse, &m.sys, &m.goroutines)
			break
		}
		if i > 3000 {
			b.Fatal("hub did not report its memory")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			m.rss = kb << 10
		}
	}
	return m
}

// childMemStats serves the hub's memory on SIGUSR1: live heap and stacks
// after a GC, Go's total from the OS, goroutines; written to file, with a
// heap profile in file.N.heap (N counts the requests). SIGUSR2 starts a
// CPU profile into file.cpu, the next SIGUSR2 stops it.
func childMemStats(file string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	prof := make(chan os.Signal, 1)
	signal.Notify(prof, syscall.SIGUSR2)
	go func() {
		var f *os.File
		for range prof {
			if f == nil {
				f, _ = os.Create(file + ".cpu")
				pprof.StartCPUProfile(f)
			} else {
				pprof.StopCPUProfile()
				f.Close()
				f = nil
			}
		}
	}()
	go func() {
		for n := 0; ; n++ {
			<-sig
			runtime.GC()
			if h, err := os.Create(fmt.Sprintf("%s.%d.heap", file, n)); err == nil {
				pprof.WriteHeapProfile(h)
				h.Close()
			}
			debug.FreeOSMemory()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			publish(file, []byte(fmt.Sprintf("%d %d %d %d\n", ms.HeapInuse, ms.StackInuse, ms.Sys, runtime.NumGoroutine())))
		}
	}()
}

// scalePeerGW runs one peer gateway in this process with its own two-site
// map (hub and itself): the peers are the hub's load, not what is measured.
// tweak, if set, changes the configuration.
func scalePeerGW(b *testing.B, m *sitemap.Map, site string, tweak func(*Config)) (*Gateway, context.CancelFunc, chan struct{}) {
	cfg := DefaultConfig()
	cfg.Map, cfg.Site, cfg.Prime, cfg.DrainTimeout = m, site, false, 100*time.Millisecond
	cfg.AllowPorts = PortSet{{1, 65535}} // the destinations listen on free ports, not registered by a shim
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if tweak != nil {
		tweak(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	return g, cancel, done
}

// BenchmarkScaleHub: a hub gateway (its own process, production defaults
// but no priming: loopback has no path to learn) with 254 peer sites, the
// most a site map allows (ids 1-255), each joined by a bulk and an express
// link (508 TCP connections). Reported: memory per idle peer (both links
// and the trunk), the hub's idle CPU with every link up, memory per idle
// stream once MPI5K_SCALE_STREAMS streams (default 16000) cross it to
// destinations behind the peers, and the idle CPU with them open.
//
// Every process holds one descriptor per stream (hub: the LAN sockets;
// this process: the peers' connections to the destinations; a destination
// child; a client child), so the stream count is bounded by RLIMIT_NOFILE,
// whose hard limit only CAP_SYS_RESOURCE can raise: 20000 on the machine
// these figures come from. Per-stream memory is measured at what fits and
// compared at two counts to check it is linear. With MPI5K_SCALE_LAN=mx
// the LANs are MX over loopback UDP (scale_mx_bench_test.go) and no
// stream holds a descriptor.
func BenchmarkScaleHub(b *testing.B) {
	const peers = 254
	nStreams := 16000
	if v := os.Getenv("MPI5K_SCALE_STREAMS"); v != "" {
		nStreams, _ = strconv.Atoi(v)
	}
	lanMX := false
	switch v := os.Getenv("MPI5K_SCALE_LAN"); v {
	case "", "tcp":
	case "mx":
		lanMX = true
	default:
		b.Fatalf("MPI5K_SCALE_LAN=%q: want tcp or mx", v)
	}
	if lanMX {
		// Links, the peers' listeners, UDP links and timers: no stream.
		raiseNoFile(b, 4096)
	} else {
		// Each of the hub, the peers (this process), the destinations and
		// the clients holds one descriptor per stream.
		raiseNoFile(b, uint64(nStreams+2000))
	}
	hubIP := netip.MustParseAddr("127.19.0.1")
	peerIP := func(k int) netip.Addr { return netip.AddrFrom4([4]byte{127, 20, byte(k), 1}) }
	dstIP := func(k int) netip.Addr { return netip.AddrFrom4([4]byte{127, 20, byte(k), 10}) }

	hubLAN := netip.AddrPortFrom(hubIP, freePort(b, hubIP))
	hubWAN := netip.AddrPortFrom(hubIP, freePort(b, hubIP))
	full := sitemap.NewBuilder().AddSite("hub", 1, hubLAN, hubWAN).AddNet("hub", netip.MustParsePrefix("127.19.0.0/16"))
	peerMaps := make([]*sitemap.Map, peers+1)
	for k := 1; k <= peers; k++ {
		name := fmt.Sprintf("p%d", k)
		lan := netip.AddrPortFrom(peerIP(k), freePort(b, peerIP(k)))
		wan := netip.AddrPortFrom(peerIP(k), freePort(b, peerIP(k)))
		net24 := netip.PrefixFrom(peerIP(k), 24).Masked()
		full.AddSite(name, uint8(k+1), lan, wan).AddNet(name, net24)
		pm, err := sitemap.NewBuilder().AddSite("hub", 1, hubLAN, hubWAN).AddNet("hub", netip.MustParsePrefix("127.19.0.0/16")).
			AddSite(name, uint8(k+1), lan, wan).AddNet(name, net24).Build()
		if err != nil {
			b.Fatal(err)
		}
		peerMaps[k] = pm
	}
	m, err := full.Build()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	mp := filepath.Join(dir, "sites.conf")
	f, _ := os.Create(mp)
	m.WriteTo(f)
	f.Close()
	memFile := filepath.Join(dir, "mem")
	ready := filepath.Join(dir, "hub.ready")
	hub := exec.Command(os.Args[0], "-test.run=^$")
	hub.Env = append(os.Environ(), "MPI5K_GW_CHILD="+mp+",hub,"+ready, "MPI5K_GW_NOPRIME=1", "MPI5K_GW_MEMSTATS="+memFile)
	// listening: the LAN port answers (MX: the WAN port; no kernel socket
	// serves the LAN).
	listening := hubLAN
	hubMXPort := 0
	if lanMX {
		hubMXPort = freeUDPPort(b)
		hub.Env = append(hub.Env, fmt.Sprintf("MPI5K_GW_LAN_MX=%d,%d", hubMXPort, nStreams+1024))
		listening = hubWAN
	}
	hub.Stderr = os.Stderr
	hub.SysProcAttr = diesWithParent
	if err := hub.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { hub.Process.Kill(); hub.Wait() }() // measured: no drain needed
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", listening.String()); err == nil {
			c.Close()
			break
		}
		if i > 500 {
			b.Fatal("hub did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second)
	m0 := memOf(b, hub, memFile)

	// One destination listener behind each peer, in a child process of
	// their own (file descriptors: see BenchmarkScaleHub).
	// With MX, one endpoint is every destination: the peers resolve each
	// destination address to it.
	dsts := make([]string, peers)
	for k := 1; k <= peers; k++ {
		if lanMX {
			dsts[k-1] = netip.AddrPortFrom(dstIP(k), 7000).String()
		} else {
			dsts[k-1] = netip.AddrPortFrom(dstIP(k), freePort(b, dstIP(k))).String()
		}
	}
	dstList := filepath.Join(dir, "dsts")
	os.WriteFile(dstList, []byte(strings.Join(dsts, "\n")+"\n"), 0o644)
	acceptedFile := filepath.Join(dir, "accepted")
	dc := exec.Command(os.Args[0], "-test.run=^$")
	dc.Env = append(os.Environ(), "MPI5K_SCALE_DST="+dstList+","+acceptedFile)
	var peerTweak func(*Config)
	if lanMX {
		dstPort := freeUDPPort(b)
		dc.Env = append(os.Environ(), fmt.Sprintf("MPI5K_SCALE_DST_MX=%d,%s", dstPort, acceptedFile))
		dst := mx.Addr{MAC: testnet.UDPMAC(dstPort), EP: mxlan.Endpoint}
		peerTweak = func(c *Config) {
			c.Transport = scalePeerMX(b, dst)
			c.Chunk = 1 << 10 // the load side's read buffer per idle stream
		}
	}
	dc.Stderr = os.Stderr
	dc.SysProcAttr = diesWithParent
	if err := dc.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { dc.Process.Kill(); dc.Wait() }()
	for i := 0; ; i++ { // the count file appears once every listener is open
		if _, err := os.Stat(acceptedFile); err == nil {
			break
		}
		if i > 1000 {
			b.Fatal("destination child did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var stops []func()
	defer func() { stopAll(stops) }()
	t0 := time.Now()
	for k := 1; k <= peers; k++ {
		_, cancel, done := scalePeerGW(b, peerMaps[k], fmt.Sprintf("p%d", k), peerTweak)
		stops = append(stops, func() { cancel(); <-done })
	}
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if i > 12000 {
			b.Fatal("hub not ready after 120 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Logf("hub with %d peers (%d links) ready %v after the peers started", peers, 2*peers, time.Since(t0).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // links settle (first keepalives, RTT samples)
	m1 := memOf(b, hub, memFile)
	const idle = 10 * time.Second
	c0 := cpuTime(hub.Process.Pid)
	hub.Process.Signal(syscall.SIGUSR2) // CPU profile of the idle mesh
	time.Sleep(idle)
	hub.Process.Signal(syscall.SIGUSR2)
	cpuLinks := cpuTime(hub.Process.Pid) - c0
	b.Logf("hub idle CPU over %v with %d peers: %v (%.3f%% of a core)", idle, peers, cpuLinks, 100*cpuLinks.Seconds()/idle.Seconds())
	if d := os.Getenv("MPI5K_SCALE_PROFILES"); d != "" { // keep the profiles
		defer func() { exec.Command("sh", "-c", "cp "+memFile+".* "+d).Run() }()
	}

	// Streams: a client child opens them from the hub's site to the
	// destinations in turn; a stream counts once its destination has
	// accepted the peer gateway's connection.
	t1 := time.Now()
	clientsDone := filepath.Join(dir, "clients.done")
	cl := exec.Command(os.Args[0], "-test.run=^$")
	cl.Env = append(os.Environ(), fmt.Sprintf("MPI5K_SCALE_CLIENTS=%s,%d,%s,%s", hubLAN, nStreams, dstList, clientsDone))
	openLimit := 12000 // 10 ms polls: 120 s
	if lanMX {
		cl.Env = append(os.Environ(), fmt.Sprintf("MPI5K_SCALE_CLIENTS_MX=%d,%s,%d,%s,%s", hubMXPort, hubLAN, nStreams, dstList, clientsDone))
		// An MX endpoint matches a message against its posted receives
		// in a list (one per stream): opening N streams takes time in N².
		openLimit = max(openLimit, nStreams/2)
	}
	cl.Stderr = os.Stderr
	cl.SysProcAttr = diesWithParent
	if err := cl.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cl.Process.Kill(); cl.Wait() }()
	accepted := func() int {
		v, _ := os.ReadFile(acceptedFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(v)))
		return n
	}
	for i := 0; accepted() < nStreams; i++ {
		if v, err := os.ReadFile(clientsDone); err == nil && strings.TrimSpace(string(v)) != "ok" {
			b.Fatalf("clients: %s", v)
		}
		if i > openLimit {
			b.Fatalf("only %d of %d streams reached their destination after %v", accepted(), nStreams, time.Duration(openLimit)*10*time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Logf("%d streams open in %v", nStreams, time.Since(t1).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	m2 := memOf(b, hub, memFile)
	c1 := cpuTime(hub.Process.Pid)
	time.Sleep(idle)
	cpuStreams := cpuTime(hub.Process.Pid) - c1
	m3 := memOf(b, hub, memFile) // again: nothing grows while idle

	per := func(a, z uint64, n int) float64 { return (float64(z) - float64(a)) / float64(n) }
	b.ReportMetric(per(m0.rss, m1.rss, peers), "rss-B/peer")
	b.ReportMetric(per(m0.heapInuse+m0.stackInuse, m1.heapInuse+m1.stackInuse, peers), "heap+stack-B/peer")
	b.ReportMetric(per(m1.rss, m2.rss, nStreams), "rss-B/stream")
	b.ReportMetric(per(m1.heapInuse+m1.stackInuse, m2.heapInuse+m2.stackInuse, nStreams), "heap+stack-B/stream")
	b.ReportMetric(100*cpuLinks.Seconds()/idle.Seconds(), "idle-cpu-%-254peers")
	b.ReportMetric(100*cpuStreams.Seconds()/idle.Seconds(), "idle-cpu-%-with-streams")
	b.ReportMetric(float64(m2.goroutines-m1.goroutines)/float64(nStreams), "goroutines/stream")
	b.Logf("hub memory  rss / heap in use / stack in use / Go sys / goroutines")
	for _, r := range []struct {
		what string
		m    hubMem
	}{{"started, no peer up", m0}, {fmt.Sprintf("%d peers up", peers), m1}, {fmt.Sprintf("+%d idle streams", nStreams), m2}, {"10 s later", m3}} {
		b.Logf("  %-22s %7.1f MiB %7.1f MiB %7.1f MiB %7.1f MiB %d", r.what, mib(r.m.rss), mib(r.m.heapInuse), mib(r.m.stackInuse), mib(r.m.sys), r.m.goroutines)
	}
	b.Logf("hub idle CPU over %v: %v with %d peers (%.3f%% of a core), %v with %d streams too", idle, cpuLinks, peers,
		100*cpuLinks.Seconds()/idle.Seconds(), cpuStreams, nStreams)
}

// stopAll stops in-process gateways concurrently: one after another, each
// one's drain would add up (254 x 10 s with the default DrainTimeout).
func stopAll(stops []func()) {
	var wg sync.WaitGroup
	for _, s := range stops {
		wg.Add(1)
		go func() { defer wg.Done(); s() }()
	}
	wg.Wait()
}

func mib(v uint64) float64 { return float64(v) / (1 << 20) }

// BenchmarkRejoin64: 64 gateways in one process form a full mesh (2016
// site pairs, 2 links each); one site's gateway stops and starts again on
// the same addresses. Reported: the time from its restart until every link
// of the mesh is up again, and how long the mesh took to form at first.
func BenchmarkRejoin64(b *testing.B) {
	const sites = 64
	// Two links per site pair, both ends in this process, plus listeners.
	raiseNoFile(b, 2*2*sites*(sites-1)+1000)
	bl := sitemap.NewBuilder()
	for k := 1; k <= sites; k++ {
		ip := netip.AddrFrom4([4]byte{127, 21, byte(k), 1})
		name := fmt.Sprintf("s%d", k)
		bl.AddSite(name, uint8(k), netip.AddrPortFrom(ip, freePort(b, ip)), netip.AddrPortFrom(ip, freePort(b, ip))).
			AddNet(name, netip.PrefixFrom(ip, 24).Masked())
	}
	m, err := bl.Build()
	if err != nil {
		b.Fatal(err)
	}
	gws := make([]*Gateway, sites+1)
	cancels := make([]context.CancelFunc, sites+1)
	dones := make([]chan struct{}, sites+1)
	start := func(k int) {
		gws[k], cancels[k], dones[k] = scalePeerGW(b, m, fmt.Sprintf("s%d", k), nil)
	}
	defer func() {
		var stops []func()
		for k := 1; k <= sites; k++ {
			if cancels[k] != nil {
				stops = append(stops, func() { cancels[k](); <-dones[k] })
			}
		}
		stopAll(stops)
	}()
	meshUp := func(limit time.Duration) time.Duration {
		t0 := time.Now()
		for {
			up := true
			for k := 1; k <= sites && up; k++ {
				up = gws[k].allUp()
			}
			if up {
				return time.Since(t0)
			}
			if time.Since(t0) > limit {
				b.Fatalf("mesh not up after %v", limit)
			}
			time.Sleep(time.Millisecond)
		}
	}
	t0 := time.Now()
	for k := 1; k <= sites; k++ {
		start(k)
	}
	meshUp(2 * time.Minute)
	formed := time.Since(t0)
	b.Logf("%d-site mesh (%d links) formed in %v", sites, sites*(sites-1), formed.Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	b.ResetTimer()
	var rejoin []time.Duration
	for i := 0; i < b.N; i++ {
		k := sites / 2
		stop := time.Now()
		cancels[k]()
		<-dones[k]
		down := time.Since(stop)
		start(k)
		d := meshUp(time.Minute)
		rejoin = append(rejoin, d)
		b.Logf("site s%d stopped (%v to drain) and restarted: mesh whole again %v after its restart", k, down.Round(time.Millisecond), d.Round(time.Millisecond))
		time.Sleep(time.Second)
	}
	b.StopTimer()
	var sum time.Duration
	for _, d := range rejoin {
		sum += d
	}
	b.ReportMetric(float64(sum.Milliseconds())/float64(len(rejoin)), "rejoin-ms")
	b.ReportMetric(float64(formed.Milliseconds()), "form-ms")
}

// scaleDstChild listens on every address of the file (one a line), holds
// each accepted connection open and idle, and keeps the count of accepted
// connections in countFile. spec: "listfile,countfile".
func scaleDstChild(spec string) int {
	f := strings.Split(spec, ",")
	b, err := os.ReadFile(f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var n atomic.Int64
	var mu sync.Mutex
	var held []net.Conn
	for _, a := range strings.Fields(string(b)) {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				n.Add(1)
			}
		}()
	}
	reportCount(&n, f[1])
	return 0 // not reached: reportCount runs until the child is killed
}

// scaleClientChild opens streams through a gateway as the shim does and
// holds them idle. spec: "gatewayLAN,count,dstlistfile,donefile"; donefile
// gets "ok" or the first error.
func scaleClientChild(spec string) int {
	f := strings.Split(spec, ",")
	gw := netip.MustParseAddrPort(f[0])
	n, _ := strconv.Atoi(f[1])
	dsts, err := readDsts(f[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conns := make([]net.Conn, n)
	openEach(n, f[3], func(i int) (err error) {
		src := netip.AddrFrom4([4]byte{127, 19, byte(1 + i%200), 2})
		conns[i], err = lanOpen(gw, src, dsts[i%len(dsts)])
		return err
	})
	select {} // hold the streams until killed
}

// readDsts reads the destination child's addresses from file.
func readDsts(file string) ([]netip.AddrPort, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var dsts []netip.AddrPort
	for _, a := range strings.Fields(string(b)) {
		dsts = append(dsts, netip.MustParseAddrPort(a))
	}
	return dsts, nil
}

// openEach opens streams 0..n-1 with open, on 32 goroutines, until all
// are open or one fails, and publishes the verdict to file (publishDone).
func openEach(n int, file string, open func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := open(i); err != nil {
					firstErr.Store(fmt.Sprintf("stream %d: %v", i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	publishDone(&firstErr, file)
}

// publish writes b to file through a rename: the parent polls for the
// file and must never read it between its creation and its write.
func publish(file string, b []byte) {
	if err := os.WriteFile(file+".tmp", b, 0o644); err == nil {
		os.Rename(file+".tmp", file)
	}
}

// publishDone publishes a client child's verdict: "ok", or the first
// error stored in firstErr.
func publishDone(firstErr *atomic.Value, file string) {
	msg := "ok"
	if e := firstErr.Load(); e != nil {
		msg = e.(string)
	}
	publish(file, []byte(msg))
}

// reportCount publishes n to file whenever it changes, until the process
// is killed (a destination child's count of streams held).
func reportCount(n *atomic.Int64, file string) {
	for last := int64(-1); ; time.Sleep(20 * time.Millisecond) {
		if v := n.Load(); v != last {
			publish(file, []byte(strconv.FormatInt(v, 10)))
			last = v
		}
	}
}
