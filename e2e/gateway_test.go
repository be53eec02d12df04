package e2e

// End-to-end tests and figures of the gateway pair on the emulated grid:
// bulk throughput through the pair vs direct over a 200 Mbit/s, 20 ms RTT
// WAN, and small-message latency while one stream saturates the WAN link.
// The traffic programs are this test binary re-executed inside lab hosts
// (TestGatewayHelper), speaking the LAN protocol exactly as the shim does,
// so these figures do not depend on the shim.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
)

// TestGatewayHelper is not a test: it is the traffic program run inside
// lab hosts when MPI5K_GWHELPER is set ("sink ADDR", "echo ADDR",
// "stall ADDR", "send DST GW SECONDS", "stuck DST GW SECONDS",
// "pingpong DST GW COUNT", "sumserve ADDR", "sumsend DST GW STREAMS
// MAXBYTES SEED"; GW "-" means direct).
func TestGatewayHelper(t *testing.T) {
	spec := os.Getenv("MPI5K_GWHELPER")
	if spec == "" {
		t.Skip("helper process only")
	}
	err := gwHelper(strings.Fields(spec))
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func gwHelper(a []string) error {
	switch a[0] {
	case "sink", "echo", "stall":
		ln, err := net.Listen("tcp", a[1])
		if err != nil {
			return err
		}
		fmt.Println("listening")
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			if a[0] == "stall" {
				// A destination that never reads: hold the connection open.
				defer c.Close()
				continue
			}
			go func() {
				defer c.Close()
				if a[0] == "echo" {
					io.Copy(c, c)
					return
				}
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}()
		}
	case "send":
		c, err := helperDial(a[1], a[2])
		if err != nil {
			return err
		}
		secs, _ := strconv.ParseFloat(a[3], 64)
		buf := make([]byte, 1<<20)
		start := time.Now()
		end := start.Add(time.Duration(secs * float64(time.Second)))
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		c.(*net.TCPConn).CloseWrite()
		var n int64
		if err := binary.Read(c, binary.BigEndian, &n); err != nil {
			return fmt.Errorf("reading count: %w", err)
		}
		fmt.Printf("%d %f\n", n, time.Since(start).Seconds())
		return nil
	case "stuck":
		// Writes until the deadline towards a destination that may stop
		// reading; prints how many bytes the path accepted.
		c, err := helperDial(a[1], a[2])
		if err != nil {
			return err
		}
		secs, _ := strconv.ParseFloat(a[3], 64)
		c.SetWriteDeadline(time.Now().Add(time.Duration(secs * float64(time.Second))))
		var n int64
		buf := make([]byte, 1<<20)
		for {
			k, err := c.Write(buf)
			n += int64(k)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			} else if err != nil {
				return err
			}
		}
		fmt.Println(n)
		return nil
	case "sumserve":
		return serveSums(a[1])
	case "sumsend":
		return sumSend(a[1], a[2], a[3], a[4], a[5])
	case "get":
		r, err := http.Get(a[1])
		if err != nil {
			return err
		}
		defer r.Body.Close()
		_, err = io.Copy(os.Stdout, r.Body)
		return err
	case "pingpong":
		c, err := helperDial(a[1], a[2])
		if err != nil {
			return err
		}
		count, _ := strconv.Atoi(a[3])
		size := 1
		if len(a) > 4 {
			size, _ = strconv.Atoi(a[4])
		}
		gap := 5 * time.Millisecond // MPI-like gaps, not a busy loop
		if len(a) > 5 {
			ms, _ := strconv.Atoi(a[5])
			gap = time.Duration(ms) * time.Millisecond
		}
		b := make([]byte, size)
		var lat []time.Duration
		// Warm-up round trips, not measured: the first one includes the far
		// gateway's connect to the destination (the direct case's TCP
		// handshake is not measured either).
		for i := 0; i < 3; i++ {
			c.Write(b)
			io.ReadFull(c, b)
		}
		for i := 0; i < count; i++ {
			t := time.Now()
			if _, err := c.Write(b); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, b); err != nil {
				return err
			}
			lat = append(lat, time.Since(t))
			if d := lat[len(lat)-1]; os.Getenv("MPI5K_GWHELPER_SLOW") != "" && d > 30*time.Millisecond {
				fmt.Fprintf(os.Stderr, "slow round trip %d: %v\n", i, d)
			}
			time.Sleep(gap)
		}
		slices.Sort(lat)
		// p50 p99 max p90: callers index the first three, the queueing
		// checks of TestGatewayWAN read p90.
		fmt.Printf("%d %d %d %d\n", lat[len(lat)/2].Microseconds(), lat[len(lat)*99/100].Microseconds(), lat[len(lat)-1].Microseconds(),
			lat[len(lat)*9/10].Microseconds())
		return nil
	}
	return fmt.Errorf("unknown helper mode %q", a[0])
}

// sumSend runs streams checksummed streams to a sumserve server at dst
// through gw, 16 at a time: the first of maxBytes, the others of
// testnet.StreamSize sizes drawn from seed. It prints the streams and bytes
// sent and the seconds taken; any stream lost, cut or altered is an error.
func sumSend(dst, gw, streams, maxBytes, seed string) error {
	n, err1 := strconv.Atoi(streams)
	maxB, err2 := strconv.Atoi(maxBytes)
	sd, err3 := strconv.ParseUint(seed, 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("sumsend: %w", err)
	}
	start := time.Now()
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	var total atomic.Int64
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem }()
			r := rand.New(rand.NewPCG(sd, uint64(i)))
			size := maxB
			if i > 0 {
				size = testnet.StreamSize(r, maxB)
			}
			c, err := helperDial(dst, gw)
			if err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			defer c.Close()
			if err := testnet.SendAndCheck(c.(*net.TCPConn), r, size); err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			total.Add(int64(size))
		}(i)
	}
	for i := 0; i < cap(sem); i++ {
		sem <- struct{}{}
	}
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if len(all) > 0 {
		return fmt.Errorf("%d of %d streams failed: %w", len(all), n, errors.Join(all...))
	}
	fmt.Printf("%d %d %f\n", n, total.Load(), time.Since(start).Seconds())
	return nil
}

// serveSums answers every connection to addr with testnet.SumServer,
// after printing "listening".
func serveSums(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go testnet.SumServer(c.(*net.TCPConn))
	}
}

// helperDial connects to dst directly (gw "-") or through the site gateway
// at gw with an OPEN frame, as the shim does.
func helperDial(dst, gw string) (net.Conn, error) {
	if gw == "-" {
		return net.Dial("tcp", dst)
	}
	c, err := net.Dial("tcp", gw)
	if err != nil {
		return nil, err
	}
	o := header.Open{Dst: netip.MustParseAddrPort(dst), Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Label: "e2e helper"}
	body, err := header.AppendOpen(nil, &o)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body)); err != nil {
		return nil, err
	}
	return c, nil
}

// helperPorts are the ports of the helper servers (sink, echo, sumserve...),
// which are no ranks and register no port with their gateway: gateways
// the tests start for helper traffic allow them (--wan-allow-ports).
const helperPorts = "7000-7199"

func gatewayBinary(t *testing.T) string {
	if p := os.Getenv("MPI5K_GATEWAY_BIN"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../bin/mpi5k-gateway")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("need bin/mpi5k-gateway (run make): %v", err)
	}
	return p
}

// helper runs the helper program in host and returns its command.
func helper(t *testing.T, ctx context.Context, l *testbed.Lab, host string, args ...string) *exec.Cmd {
	c := l.CommandContext(ctx, host, os.Args[0], "-test.run=^TestGatewayHelper$")
	c.Env = append(c.Env, "MPI5K_GWHELPER="+strings.Join(args, " "))
	c.Stderr = os.Stderr
	return c
}

// startServer starts a helper server and waits for it to listen.
func startServer(t *testing.T, ctx context.Context, l *testbed.Lab, host string, args ...string) {
	c := helper(t, ctx, l, host, args...)
	out, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "listening") {
		t.Fatalf("helper %v did not start", args)
	}
}

func run(t *testing.T, ctx context.Context, l *testbed.Lab, host string, args ...string) []float64 {
	out, err := helper(t, ctx, l, host, args...).Output()
	if err != nil {
		t.Fatalf("helper %v: %v", args, err)
	}
	var v []float64
	for _, f := range strings.Fields(string(out)) {
		x, _ := strconv.ParseFloat(f, 64)
		v = append(v, x)
	}
	return v
}

// startLabGateways runs bin/mpi5k-gateway in every site's gateway host,
// waits until all are ready, and returns a function that stops them
// (SIGINT: drain and exit). The gateways run the shared trunk, whose
// express link, yield and keep-warm these tests measure, whatever the
// machine's TCP (the default auto picks a link per stream on BBR hosts);
// a --wan-trunk in gwArgs comes later and wins.
func startLabGateways(t *testing.T, ctx context.Context, l *testbed.Lab, gwArgs ...string) (stop func()) {
	bin := gatewayBinary(t)
	dir := t.TempDir()
	var cmds []*exec.Cmd
	stop = func() {
		for _, g := range cmds {
			g.Process.Signal(os.Interrupt)
		}
		for _, g := range cmds {
			g.Wait()
		}
		cmds = nil
	}
	t.Cleanup(func() { stop() })
	for _, site := range l.Sites() {
		gw := l.Gateway(site)
		ready := filepath.Join(dir, site+".ready")
		args := append([]string{"--map", l.SiteMapPath(), "--site", site, "--ready-file", ready, "--log-level", "warn",
			"--wan-allow-ports", helperPorts, "--wan-trunk", "shared"}, gwArgs...)
		g := l.CommandContext(ctx, gw, bin, args...)
		g.Stderr = os.Stderr
		if err := g.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, g)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, site := range l.Sites() {
		for {
			if _, err := os.Stat(filepath.Join(dir, site+".ready")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("gateways did not become ready")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return stop
}

// wanLab is a two-site lab of one node per site on a 200 Mbit/s WAN, with
// a sink and an echo server on site2's node.
type wanLab struct {
	l                 *testbed.Lab
	ctx               context.Context
	m                 *sitemap.Map
	src, dstHost      string
	dst               netip.Addr
	sink, echo, gwLAN string // servers; site1's gateway LAN address
}

func newWANLab(t *testing.T, rtt time.Duration) *wanLab {
	// MPI5K_LAB_LOSS ("0.1%") adds random loss to the WAN for measurements.
	return newLossyWANLab(t, rtt, os.Getenv("MPI5K_LAB_LOSS"))
}

// newLossyWANLab is newWANLab with random loss ("0.1%"; "" for none).
func newLossyWANLab(t *testing.T, rtt time.Duration, loss string) *wanLab {
	labRequireRoot(t)
	c := testbed.Config{Nodes: 1, RTT: rtt, WANRate: 200e6}
	if v := loss; v != "" {
		var err error
		if c.Loss, err = testbed.ParseLoss(v); err != nil {
			t.Fatalf("MPI5K_LAB_LOSS: %v", err)
		}
	}
	w := &wanLab{l: labUp(t, c)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.ctx = ctx
	w.src, w.dstHost = w.l.Hosts("site1", false)[0], w.l.Hosts("site2", false)[0]
	w.dst = w.l.Addr(w.dstHost)
	w.sink = netip.AddrPortFrom(w.dst, 7001).String()
	w.echo = netip.AddrPortFrom(w.dst, 7002).String()
	startServer(t, ctx, w.l, w.dstHost, "sink", w.sink)
	startServer(t, ctx, w.l, w.dstHost, "echo", w.echo)
	var err error
	if w.m, err = sitemap.Load(w.l.SiteMapPath()); err != nil {
		t.Fatal(err)
	}
	site1, _ := w.m.Site("site1")
	w.gwLAN = site1.LAN.String()
	return w
}

// scrape returns the /metrics text of the gateway at gw (started with
// --metrics 0.0.0.0:9105: a bare port listens on loopback only), fetched from host.
func (w *wanLab) scrape(t *testing.T, host string, gw netip.Addr) (string, error) {
	out, err := helper(t, w.ctx, w.l, host, "get", "http://"+netip.AddrPortFrom(gw, 9105).String()+"/metrics").Output()
	return string(out), err
}

// bbrEvents counts, over the WAN links of the gateway at gw, BBR's
// PROBE_RTT dips and the PROBE_RTT guard's holds and skips.
type bbrEvents struct{ dips, holds, skips, held float64 }

func (e bbrEvents) minus(o bbrEvents) bbrEvents {
	return bbrEvents{e.dips - o.dips, e.holds - o.holds, e.skips - o.skips, e.held - o.held}
}

func (e bbrEvents) String() string {
	return fmt.Sprintf("%.0f PROBE_RTT dips, %.0f guard holds (%.0f ms held), %.0f skips", e.dips, e.holds, e.held*1e3, e.skips)
}

// bbr returns the gateway's bbrEvents (all -1 if its metrics are
// unavailable).
func (w *wanLab) bbr(t *testing.T, host string, gw netip.Addr) bbrEvents {
	out, err := w.scrape(t, host, gw)
	if err != nil {
		return bbrEvents{-1, -1, -1, -1}
	}
	var e bbrEvents
	for _, line := range strings.Split(out, "\n") {
		v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		switch {
		case strings.HasPrefix(line, "mpi5k_wan_bbr_probe_rtt_total{"):
			e.dips += v
		case strings.HasPrefix(line, "mpi5k_wan_bbr_holds_total{"):
			e.holds += v
		case strings.HasPrefix(line, "mpi5k_wan_bbr_probe_rtt_skips_total{"):
			e.skips += v
		case strings.HasPrefix(line, "mpi5k_wan_bbr_hold_seconds_total{"):
			e.held += v
		}
	}
	return e
}

// windows returns the WAN sockets' cwnd and ssthresh of the gateway at gw,
// by link, and its express renewals ("link 1: cwnd 52 ssthresh 36, express
// renewals 2").
func (w *wanLab) windows(t *testing.T, host string, gw netip.Addr) string {
	out, err := w.scrape(t, host, gw)
	if err != nil {
		return "metrics unavailable: " + err.Error()
	}
	v := map[string]string{}
	var links []string
	for _, line := range strings.Split(out, "\n") {
		for _, k := range []string{"cwnd", "ssthresh"} {
			if !strings.HasPrefix(line, "mpi5k_wan_tcp_"+k+"_segments{") {
				continue
			}
			_, rest, _ := strings.Cut(line, `link="`)
			link, _, _ := strings.Cut(rest, `"`)
			if _, ok := v[link]; !ok {
				links = append(links, link)
			}
			v[link] += " " + k + " " + line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	var b []string
	for _, link := range links {
		b = append(b, "link "+link+":"+v[link])
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "mpi5k_wan_express_renewals_total{") {
			b = append(b, "express renewals "+line[strings.LastIndexByte(line, ' ')+1:])
		}
	}
	return strings.Join(b, ", ")
}

// TestGatewayWAN measures, on one 200 Mbit/s 20 ms RTT lab:
// (b) bulk goodput through the gateway pair vs direct, and
// (d) 1-byte ping-pong latency (p50/p99) through the pair while one stream
// saturates the WAN connection, vs the RTT.
func TestGatewayWAN(t *testing.T) {
	const rtt = 20 * time.Millisecond
	gwArgs := []string{"--wan-cc", "bbr"}
	// MPI5K_GW_ARGS replaces the gateway arguments; then only the
	// measurements of those arguments run.
	custom := os.Getenv("MPI5K_GW_ARGS") != ""
	if custom {
		gwArgs = strings.Fields(os.Getenv("MPI5K_GW_ARGS"))
	}
	w := newWANLab(t, rtt)
	l, ctx, src, dstHost, dst, sink, echo, gwLAN := w.l, w.ctx, w.src, w.dstHost, w.dst, w.sink, w.echo, w.gwLAN
	gwArgs = append(gwArgs, "--metrics", "0.0.0.0:9105")
	stopGW := startLabGateways(t, ctx, l, gwArgs...)
	site1, _ := w.m.Site("site1")
	site2, _ := w.m.Site("site2")
	scrape := func(host string, gw netip.Addr) (string, error) { return w.scrape(t, host, gw) }
	// wanStats returns the WAN retransmission counters of site1's gateway.
	wanStats := func() string {
		out, err := scrape(src, site1.LAN.Addr())
		if err != nil {
			return "metrics unavailable: " + err.Error()
		}
		var keep []string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "mpi5k_wan_tcp_retransmits_total") || strings.HasPrefix(line, "mpi5k_wan_tcp_rtos_total") ||
				strings.HasPrefix(line, "mpi5k_wan_tcp_retransmits_fast_total") {
				keep = append(keep, line)
			}
		}
		return strings.Join(keep, "; ")
	}
	// farRSS returns the resident memory of site2's gateway in MiB.
	farRSS := func() float64 {
		out, err := scrape(dstHost, site2.LAN.Addr())
		if err != nil {
			t.Fatalf("site2 gateway metrics: %v", err)
		}
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(dropSite(line), "process_resident_memory_bytes "); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err == nil {
					return x / (1 << 20)
				}
			}
		}
		t.Fatalf("site2 gateway metrics have no process_resident_memory_bytes")
		return 0
	}
	secs := "8"
	if testing.Short() {
		secs = "3"
	}
	if v := os.Getenv("MPI5K_BULK_SECS"); v != "" {
		secs = v // longer runs show BBR's PROBE_RTT (every 10 s) on direct too
	}
	d := run(t, ctx, l, src, "send", sink, "-", secs)
	probes := w.bbr(t, src, site1.LAN.Addr())
	g := run(t, ctx, l, src, "send", sink, gwLAN, secs)
	probes = w.bbr(t, src, site1.LAN.Addr()).minus(probes)
	direct, via := d[0]*8/d[1]/1e6, g[0]*8/g[1]/1e6
	// A BBR bulk link that sends for 10 s without a lower RTT sample dips
	// into PROBE_RTT (cwnd 4 for >= 200 ms): about 2.5 % of an 8 s run,
	// unless the gateway's guard holds it idle across the expiry.
	t.Logf("(b) bulk over 200 Mbit/s 20 ms: direct %.1f Mbit/s, through gateways %.1f Mbit/s (%.1f %%); site1's WAN links during it: %v",
		direct, via, 100*via/direct, probes)
	// The goal is 98 %; the bound leaves room for the noise of 2 shared
	// cores (the emulator, both gateways and the endpoints share them).
	if via < 0.75*direct {
		t.Errorf("gateway goodput %.1f Mbit/s is below 75 %% of direct %.1f", via, direct)
	}

	// Destinations that stop reading stall only their own streams: each
	// holds at most its window in the far gateway, and the other streams
	// keep the WAN.
	if !custom {
		const stuckStreams, window = 4, 4 // MiB, the gateway default window
		stall := netip.AddrPortFrom(dst, 7003).String()
		startServer(t, ctx, l, dstHost, "stall", stall)
		rss0 := farRSS()
		var stuck []*exec.Cmd
		for range stuckStreams {
			c := helper(t, ctx, l, src, "stuck", stall, gwLAN, "30")
			c.Stdout = io.Discard
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			defer c.Process.Kill()
			stuck = append(stuck, c)
		}
		time.Sleep(2 * time.Second) // the stuck streams fill their windows
		s := run(t, ctx, l, src, "send", sink, gwLAN, secs)
		rss1 := farRSS()
		beside := s[0] * 8 / s[1] / 1e6
		t.Logf("stalled receivers: %d streams whose destination never reads; another stream gets %.1f Mbit/s, "+
			"%.1f %% of its %.1f alone; site2 gateway RSS %.1f -> %.1f MiB (windows: %d x %d MiB)",
			stuckStreams, beside, 100*beside/via, via, rss0, rss1, stuckStreams, window)
		if beside < 0.9*via {
			t.Errorf("beside stalled streams a stream got %.1f Mbit/s, below 90 %% of %.1f", beside, via)
		}
		if grow := rss1 - rss0; grow > stuckStreams*window+16 {
			t.Errorf("site2 gateway grew %.1f MiB for %d stalled %d MiB windows", grow, stuckStreams, window)
		}
		for _, c := range stuck {
			c.Process.Kill()
			c.Wait()
		}
	}

	// lat returns the ping-pong's p50/p99/max idle and beside an 8 s bulk
	// stream, and the bulk stream's Mbit/s.
	lat := func(via string) (idle, loaded []float64, bulkMbit float64) {
		idle = run(t, ctx, l, src, "pingpong", echo, via, "100")
		bulk := helper(t, ctx, l, src, "send", sink, via, "8")
		var out strings.Builder
		bulk.Stdout = &out
		if err := bulk.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // let the bulk stream fill the pipe
		loaded = run(t, ctx, l, src, "pingpong", echo, via, "500")
		if err := bulk.Wait(); err != nil {
			t.Fatalf("bulk stream beside the ping-pong: %v", err)
		}
		var n, secs float64
		if _, err := fmt.Sscan(out.String(), &n, &secs); err != nil || secs <= 0 {
			t.Fatalf("bulk stream beside the ping-pong printed %q", out.String())
		}
		return idle, loaded, n * 8 / secs / 1e6
	}
	di, dl, dbulk := lat("-")
	before := wanStats()
	idle, loaded, gbulk := lat(gwLAN)
	t.Logf("WAN retransmissions of site1's gateway before (d): %s; after: %s", before, wanStats())
	t.Logf("(d) 1-byte ping-pong, RTT %v, p50/p90/p99/max in ms: direct idle %.2f/%.2f/%.2f/%.2f, direct beside a bulk flow %.2f/%.2f/%.2f/%.2f; "+
		"gateways idle %.2f/%.2f/%.2f/%.2f, gateways beside a bulk stream on the same WAN link %.2f/%.2f/%.2f/%.2f (gateway args %v); "+
		"the bulk meanwhile: direct %.1f Mbit/s, through the gateways %.1f",
		rtt, di[0]/1e3, di[3]/1e3, di[1]/1e3, di[2]/1e3, dl[0]/1e3, dl[3]/1e3, dl[1]/1e3, dl[2]/1e3,
		idle[0]/1e3, idle[3]/1e3, idle[1]/1e3, idle[2]/1e3, loaded[0]/1e3, loaded[3]/1e3, loaded[1]/1e3, loaded[2]/1e3, gwArgs, dbulk, gbulk)
	// Queue control must keep the queue short without starving the bulk:
	// a controller that read an offset in srtt (min_rtt set 0.7 ms low by
	// a timestamp-measured round trip) as queue took it to 75-115 Mbit/s.
	bulkKept := func(round string, mbit float64) {
		if mbit < 0.85*via {
			t.Errorf("the bulk stream beside the %s ping-pong got %.1f Mbit/s through the gateways, below 85 %% of its %.1f alone", round, mbit, via)
		}
	}
	bulkKept("first", gbulk)
	// The queueing checks read p90, not p99. A WAN queue that bulk keeps
	// full delays most messages (RTT + 7.7-14 ms at p50 and p90 alike),
	// while the p99 of 500 round trips is the fifth-worst one, which on 2
	// shared cores is a scheduling delay: on 2026-11-27, with other builds
	// running, idle round trips (no bulk at all) read p99 RTT + 6-9 ms
	// directly and through the gateways, and p99 beside bulk RTT + 16-25
	// at p50 RTT + 0.4-1.3, so no bound on it told a queue from the
	// machine. A round over the bound gets one more, and the bound holds
	// the better of two. It is RTT + 5 ms, or, when direct TCP's own p90
	// beside the same bulk shows more than 6.7 ms of queueing on this
	// machine, 3/4 of that (bench/figures/queuecontrol).
	const pq = 3 // index of p90 in the helper's output
	bound := rtt + max(5*time.Millisecond, (time.Duration(dl[pq])*time.Microsecond-rtt)*3/4)
	if p90 := time.Duration(loaded[pq]) * time.Microsecond; !custom && p90 > bound {
		_, again, bulk := lat(gwLAN)
		t.Logf("(d) p90 %v is over %v; once more: gateways beside a bulk stream %.2f/%.2f/%.2f/%.2f ms (p50/p90/p99/max), the bulk %.1f Mbit/s",
			p90, bound, again[0]/1e3, again[pq]/1e3, again[1]/1e3, again[2]/1e3, bulk)
		bulkKept("second", bulk)
		if again[pq] < loaded[pq] {
			loaded = again
		}
	}
	// (e) A message of a few KiB must cross as fast as 1 byte plus its
	// serialization. Over a BBR socket it is paced at the rate of earlier
	// app-limited messages: with a 16 KiB express threshold and BBR on every
	// WAN socket this test measured p50 33.8 ms (RTT + 13.8; direct between
	// this lab's BBR hosts 27.4); the CUBIC express link, which takes bursts
	// up to 68 KiB, 21.8 ms.
	for _, size := range []int{16 << 10, 64 << 10} {
		d := run(t, ctx, l, src, "pingpong", echo, "-", "30", strconv.Itoa(size))
		g := run(t, ctx, l, src, "pingpong", echo, gwLAN, "30", strconv.Itoa(size))
		t.Logf("(e) %d KiB ping-pong, RTT %v, p50/p99 in ms: direct %.2f/%.2f, gateways %.2f/%.2f (gateway args %v); "+
			"WAN windows after it: site1 %s; site2 %s",
			size>>10, rtt, d[0]/1e3, d[1]/1e3, g[0]/1e3, g[1]/1e3, gwArgs,
			w.windows(t, src, site1.LAN.Addr()), w.windows(t, dstHost, site2.LAN.Addr()))
		if p50 := time.Duration(g[0]) * time.Microsecond; size == 16<<10 && !custom && p50 > rtt+5*time.Millisecond {
			t.Errorf("16 KiB ping-pong through the gateways: p50 %v, more than RTT + 5 ms", p50)
		}
	}
	// With the bulk paced just below the bottleneck its queue stays empty,
	// and the express link keeps small frames out of the bulk link's
	// socket: p99 measured RTT + 1.5..3.3 ms over 6 runs (CUBIC 1.7..1.8), against
	// RTT + 13.8 ms for the same pacing without the express link. The bound
	// leaves room for the noise of 2 shared cores (idle p99 reached
	// RTT + 3.6 ms) but not for a small frame queued behind bulk.
	if !custom {
		stopGW()
		paced := []string{"--wan-cc", "cubic", "--wan-pace", "190mbit"}
		startLabGateways(t, ctx, l, paced...)
		si, sl, _ := lat(gwLAN)
		t.Logf("(d) gateways %v: idle %.2f/%.2f/%.2f/%.2f, beside a bulk stream %.2f/%.2f/%.2f/%.2f ms (p50/p90/p99/max)",
			paced, si[0]/1e3, si[pq]/1e3, si[1]/1e3, si[2]/1e3, sl[0]/1e3, sl[pq]/1e3, sl[1]/1e3, sl[2]/1e3)
		// As for the unpaced bound: p90 within RTT + 8 ms, or 3/4 of
		// direct TCP's queueing beside the bulk where this machine shows
		// more, the better of two rounds.
		pacedBound := rtt + max(8*time.Millisecond, (time.Duration(dl[pq])*time.Microsecond-rtt)*3/4)
		if p90 := time.Duration(sl[pq]) * time.Microsecond; p90 > pacedBound {
			_, again, _ := lat(gwLAN)
			t.Logf("(d) paced p90 %v is over %v; once more: %.2f/%.2f/%.2f/%.2f ms", p90, pacedBound, again[0]/1e3, again[pq]/1e3, again[1]/1e3, again[2]/1e3)
			sl[pq] = min(sl[pq], again[pq])
		}
		if p90 := time.Duration(sl[pq]) * time.Microsecond; p90 > pacedBound {
			t.Errorf("paced p90 beside a saturating stream %v, more than %v (direct beside the bulk: p90 %.2f ms): small frames wait behind bulk", p90, pacedBound, dl[pq]/1e3)
		}
	}
	// The goal is p99 <= RTT + 2 ms; p50 is what stays stable on shared cores.
	if p50 := time.Duration(loaded[0]) * time.Microsecond; p50 > rtt+5*time.Millisecond {
		t.Errorf("p50 beside a saturating stream %v, more than RTT + 5 ms", p50)
	}
	// Unpaced, queue control (on by default) keeps the bottleneck queue
	// near 1 ms while the ping-pong's messages cross it: p99 RTT + 1.5-2.1
	// ms in the runs bench/figures/queuecontrol records, where the bulk link alone
	// fills the 1-BDP queue (RTT + 7.7-14 ms; RTT + 7.8-8.1 ms when a
	// change let a draining link's bytes in flight pass for a cap in
	// force, 2026-11-24, which the old bound of RTT + 8 ms let
	// through in three of four runs). The check reads p90 (see bound).
	if p90 := time.Duration(loaded[pq]) * time.Microsecond; !custom && p90 > bound {
		t.Errorf("p90 beside a saturating stream %v with queue control, more than %v (direct beside the bulk: p90 %.2f ms): the bulk link fills the WAN queue", p90, bound, dl[pq]/1e3)
	}
}

// TestGatewayLossyExpress: at 0.1 % random loss on the WAN, 64 KiB
// ping-pongs through the gateways, with the express link's renewal and
// without. Each loss cuts the express link's window, and app-limited
// messages never regrow it: without renewal it ratchets down until every
// message needs two or more round trips (p50 63-102 ms measured where
// direct took 30 ms); with it a cold link is replaced by a fresh one,
// which slow start grows to twice a message within a few.
func TestGatewayLossyExpress(t *testing.T) {
	const rtt = 20 * time.Millisecond
	w := newLossyWANLab(t, rtt, "0.1%")
	site1, _ := w.m.Site("site1")
	site2, _ := w.m.Site("site2")
	n := "300"
	if testing.Short() {
		n = "150"
	}
	d := run(t, w.ctx, w.l, w.src, "pingpong", w.echo, "-", n, strconv.Itoa(64<<10))
	t.Logf("direct TCP: 64 KiB ping-pong p50/p99 %.2f/%.2f ms", d[0]/1e3, d[1]/1e3)
	p50 := map[bool]time.Duration{}
	for _, renew := range []bool{true, false} {
		stop := startLabGateways(t, w.ctx, w.l, "--wan-cc", "bbr", "--metrics", "0.0.0.0:9105", "--wan-express-renew="+strconv.FormatBool(renew))
		g := run(t, w.ctx, w.l, w.src, "pingpong", w.echo, w.gwLAN, n, strconv.Itoa(64<<10))
		t.Logf("gateways, --wan-express-renew=%v: 64 KiB ping-pong p50/p99 %.2f/%.2f ms; site1 %s; site2 %s",
			renew, g[0]/1e3, g[1]/1e3, w.windows(t, w.src, site1.LAN.Addr()), w.windows(t, w.dstHost, site2.LAN.Addr()))
		// Random losses cut the express window, but no other flow keeps
		// a queue: the messages stay on the express link.
		if y := w.counter(t, w.src, site1.LAN.Addr(), "mpi5k_wan_express_yields_total") +
			w.counter(t, w.dstHost, site2.LAN.Addr(), "mpi5k_wan_express_yields_total"); y != 0 {
			t.Errorf("--wan-express-renew=%v: %.0f yields of the express link under random loss and no competing flow", renew, y)
		}
		stop()
		p50[renew] = time.Duration(g[0]) * time.Microsecond
	}
	// 64 KiB is 2.6 ms at 200 Mbit/s each way: a ping-pong takes one round
	// trip and the serialization when both windows hold a message, and a
	// whole extra round trip for each direction whose window losses have cut
	// below it. Which of the two the median lands on depends on where the
	// losses fall (p50 25.9 ms here, 44.1 ms on a CI machine), so renewal
	// must keep the median within one extra round trip, and well below the
	// median of the same run without renewal (101 ms in both).
	if p50[true] > 2*rtt+12*time.Millisecond {
		t.Errorf("with renewal, 64 KiB p50 %v under 0.1 %% loss: more than 2 RTT + 12 ms", p50[true])
	}
	// Without renewal a cut window costs a whole extra round trip or more
	// (44-102 ms medians measured), so renewal must save most of one. A
	// ratio is the wrong measure near one extra round trip: 26.1 against
	// 43.2 ms once failed a "3/5 of it" bound by 0.1 ms in CI. Where the
	// losses fell, the run without renewal may not cut its windows below a
	// message (26.2 ms once, cwnd 33-39 segments at the end): then there is
	// nothing to save, and the bound above is the whole check.
	if p50[false] <= 2*rtt+12*time.Millisecond {
		t.Logf("without renewal the median kept within one extra round trip (%v): its windows were not cut below a message, so renewal had nothing to save", p50[false])
	} else if p50[true] > p50[false]-rtt*3/4 {
		t.Errorf("with renewal, 64 KiB p50 %v under 0.1 %% loss: not most of a round trip below %v without", p50[true], p50[false])
	}
}

// counter sums the samples of the metric name (a counter or gauge) in the
// /metrics of the gateway at gw, fetched from host.
func (w *wanLab) counter(t *testing.T, host string, gw netip.Addr, name string) float64 {
	t.Helper()
	out, err := w.scrape(t, host, gw)
	if err != nil {
		t.Fatalf("metrics of the gateway at %v: %v", gw, err)
	}
	return metricSum(out, name)
}

// TestGatewayYield: while a direct TCP flow keeps the WAN queue full,
// the express link's window is cut and its round trip stands a queue
// above the path's, and the sending gateway moves its messages to the
// bulk link for a while (--wan-express-yield): 64 KiB ping-pongs through
// the gateways beside the flow count yields at site1's gateway, whose
// direction the flow shares. Without the flow (TestGatewayLossyExpress,
// whose random losses cut the express window just as well) there are
// none.
func TestGatewayYield(t *testing.T) {
	const rtt = 20 * time.Millisecond
	w := newWANLab(t, rtt)
	site1, _ := w.m.Site("site1")
	stop := startLabGateways(t, w.ctx, w.l, "--metrics", "0.0.0.0:9105")
	defer stop()
	flow := make(chan []float64, 1)
	go func() { flow <- run(t, w.ctx, w.l, w.src, "send", w.sink, "-", "16") }()
	time.Sleep(2 * time.Second) // the flow fills the queue
	g := run(t, w.ctx, w.l, w.src, "pingpong", w.echo, w.gwLAN, "200", strconv.Itoa(64<<10))
	yields := w.counter(t, w.src, site1.LAN.Addr(), "mpi5k_wan_express_yields_total")
	renewals := w.counter(t, w.src, site1.LAN.Addr(), "mpi5k_wan_express_renewals_total")
	d := <-flow
	t.Logf("beside a direct flow (%.0f Mbit/s): 64 KiB ping-pong through the gateways p50/p99 %.2f/%.2f ms; site1: %.0f express renewals, %.0f yields; %s",
		d[0]*8/d[1]/1e6, g[0]/1e3, g[1]/1e3, renewals, yields, w.windows(t, w.src, site1.LAN.Addr()))
	if yields == 0 {
		t.Errorf("site1's gateway never moved its messages to the bulk link while a direct flow kept the WAN queue full (%.0f express renewals)", renewals)
	}
}

// TestGatewayKeepWarm: an MPI job pauses between bursts for longer than
// the express link's RTO (about 30 ms at 20 ms RTT with --wan-rto-min
// 10ms). With net.ipv4.tcp_slow_start_after_idle at the kernel's 1 the
// CUBIC express link then restarts from 10 segments and a 64 KiB message
// takes three round trips; with it at 0 (what the service unit sets while
// the gateway runs) the link keeps its window and the message takes one.
// The gateways only read the sysctl: it reads as the test set it while
// they run and after they stop.
func TestGatewayKeepWarm(t *testing.T) {
	const rtt = 20 * time.Millisecond
	w := newWANLab(t, rtt)
	var gws []string
	for _, site := range w.l.Sites() {
		gws = append(gws, w.l.Gateway(site))
	}
	sysctl := func() string {
		var vs []string
		for _, h := range gws {
			out, err := w.l.CommandContext(w.ctx, h, "cat", "/proc/sys/net/ipv4/tcp_slow_start_after_idle").Output()
			if err != nil {
				t.Fatalf("%s: reading tcp_slow_start_after_idle: %v", h, err)
			}
			vs = append(vs, strings.TrimSpace(string(out)))
		}
		return strings.Join(vs, ",")
	}
	setSysctl := func(v string) {
		for _, h := range gws {
			if out, err := w.l.CommandContext(w.ctx, h, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle="+v).CombinedOutput(); err != nil {
				t.Fatalf("%s: setting tcp_slow_start_after_idle=%s: %v\n%s", h, v, err, out)
			}
		}
	}
	t.Cleanup(func() { setSysctl("0") })
	if v := sysctl(); v != "0,0" {
		t.Fatalf("the lab's gateway hosts start with tcp_slow_start_after_idle %s, want 0,0 as the service unit sets it", v)
	}
	n := "30"
	if testing.Short() {
		n = "15"
	}
	p50 := map[bool]time.Duration{}
	for _, warm := range []bool{true, false} {
		want := "1,1"
		if warm {
			want = "0,0"
			setSysctl("0")
		} else {
			setSysctl("1")
		}
		stop := startLabGateways(t, w.ctx, w.l)
		if v := sysctl(); v != want {
			t.Errorf("warm %v: tcp_slow_start_after_idle %s on the gateway hosts while the gateways run, want %s as set", warm, v, want)
		}
		g := run(t, w.ctx, w.l, w.src, "pingpong", w.echo, w.gwLAN, n, strconv.Itoa(64<<10), "150")
		stop()
		if v := sysctl(); v != want {
			t.Errorf("warm %v: tcp_slow_start_after_idle %s after the gateways stopped, want %s as set", warm, v, want)
		}
		t.Logf("tcp_slow_start_after_idle=%s: 64 KiB ping-pong every 150 ms, p50/p99 %.2f/%.2f ms", want[:1], g[0]/1e3, g[1]/1e3)
		p50[warm] = time.Duration(g[0]) * time.Microsecond
	}
	// One round trip plus 2 x 2.6 ms of serialization when warm; a cold
	// link needs two more round trips.
	if p50[true] > rtt+12*time.Millisecond {
		t.Errorf("kept warm, 64 KiB p50 %v after 150 ms pauses: more than RTT + 12 ms", p50[true])
	}
	if p50[true] > p50[false]*3/5 {
		t.Errorf("kept warm, 64 KiB p50 %v: not clearly below %v without", p50[true], p50[false])
	}
}

// TestGatewayCompeting measures what queue control costs a gateway bulk
// stream against a direct TCP flow that competes for the same WAN (a
// capped link would lose its share round by round if queue control did
// not step aside): both send for 8 s at once while a ping-pong through
// the gateways keeps messages on the express link, with queue control
// (the default) and without (--wan-queue 0).
func TestGatewayCompeting(t *testing.T) {
	w := newWANLab(t, 20*time.Millisecond)
	l, ctx, src, sink, echo, gwLAN := w.l, w.ctx, w.src, w.sink, w.echo, w.gwLAN
	share := func(args ...string) (via, direct float64) {
		stop := startLabGateways(t, ctx, l, args...)
		defer stop()
		pp := helper(t, ctx, l, src, "pingpong", echo, gwLAN, "400")
		pp.Stdout = io.Discard
		if err := pp.Start(); err != nil {
			t.Fatal(err)
		}
		defer pp.Wait()
		ch := make(chan []float64, 1)
		go func() { ch <- run(t, ctx, l, src, "send", sink, "-", "8") }()
		g := run(t, ctx, l, src, "send", sink, gwLAN, "8")
		d := <-ch
		return g[0] * 8 / g[1] / 1e6, d[0] * 8 / d[1] / 1e6
	}
	// MPI5K_GW_ARGS is added to both runs' gateway arguments (a
	// --log-level debug shows queue control's decisions).
	extra := strings.Fields(os.Getenv("MPI5K_GW_ARGS"))
	// The bound is on the rounds together: one 8 s share swings by half
	// either way with either setting (the --wan-queue 0 reference alone
	// read 93 to 155 Mbit/s in one sitting), and the claim is about the
	// share a stream keeps, not any one transfer.
	var sum1, sum0 float64
	const rounds = 2
	for range rounds {
		v1, d1 := share(extra...)
		v0, d0 := share(append(slices.Clip(extra), "--wan-queue", "0")...)
		t.Logf("gateway stream beside a direct flow, Mbit/s: queue control %.1f (direct %.1f), --wan-queue 0 %.1f (direct %.1f)", v1, d1, v0, d0)
		sum1, sum0 = sum1+v1, sum0+v0
	}
	t.Logf("mean over %d rounds: queue control %.1f Mbit/s, --wan-queue 0 %.1f (ratio %.2f)", rounds, sum1/rounds, sum0/rounds, sum1/sum0)
	if sum1 < 0.5*sum0 {
		t.Errorf("with queue control the gateway stream got %.1f Mbit/s on average beside a direct flow, below half of %.1f without", sum1/rounds, sum0/rounds)
	}
}
