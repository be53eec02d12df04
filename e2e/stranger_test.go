package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
)

// TestGatewayStrangers: two keyed mpi5k-gateway processes on loopback
// (site a 127.77.1.1 dials, site b 127.77.2.1 accepts) while strangers
// (127.78.0.0/16, in no site) flood b's WAN port from 1, 16 and 256
// source addresses: connections that send nothing, half a ClientHello,
// garbage, a ClientHello a byte at a time, and a whole one. With each flood, gateway a
// restarts (the time until every link of both is up again) and both WAN
// connections are killed with ss -K (the time until they resumed), beside
// the same without a flood; b's resident memory and descriptors are
// sampled throughout. Asserted: each time within a second of the one
// without the flood, b's RSS within 64 MiB of idle, its descriptors
// within what its limits allow (MaxPendingWAN, the peer's own pool, the
// metrics server's cap, the links). MPI5K_GATEWAY_BIN runs another
// build, main's say, for the comparison.
func TestGatewayStrangers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: ss -K kills the WAN connections")
	}
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("needs ss (iproute2)")
	}
	bin := gatewayBinary(t)
	dir := t.TempDir()
	ipA, ipB := netip.MustParseAddr("127.77.1.1"), netip.MustParseAddr("127.77.2.1")
	port := func(a netip.Addr) uint16 {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return uint16(ln.Addr().(*net.TCPAddr).Port)
	}
	wanB := netip.AddrPortFrom(ipB, port(ipB))
	metA, metB := netip.AddrPortFrom(ipA, port(ipA)), netip.AddrPortFrom(ipB, port(ipB))
	var text strings.Builder
	fmt.Fprintf(&text, "site a id=1 lan=%v wan=%v\nsite b id=2 lan=%v wan=%v\nnet a 127.77.1.0/24\nnet b 127.77.2.0/24\n",
		netip.AddrPortFrom(ipA, port(ipA)), netip.AddrPortFrom(ipA, port(ipA)), netip.AddrPortFrom(ipB, port(ipB)), wanB)
	keys := map[string]string{}
	for _, s := range []string{"a", "b"} {
		keys[s] = filepath.Join(dir, s+".key")
		pub, err := gateway.GenerateKey(keys[s])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&text, "key %s %s\n", s, sitemap.FormatKey(pub))
	}
	mapPath := filepath.Join(dir, "sites.map")
	if err := os.WriteFile(mapPath, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(site string, metrics netip.AddrPort) *exec.Cmd {
		c := exec.Command(bin, "--map", mapPath, "--site", site, "--key", keys[site], "--log-level", "error",
			"--metrics", metrics.String(), "--wan-keep-warm=false")
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Signal(os.Interrupt); c.Wait() })
		return c
	}
	const limit = 10 * time.Second
	b := start("b", metB)
	a := start("a", metA)
	if d := untilLinksUp(time.Now(), limit, metA, metB); d >= limit {
		t.Fatal("links did not come up")
	}
	restart := func() time.Duration {
		a.Process.Signal(os.Interrupt)
		a.Wait()
		t0 := time.Now()
		a = start("a", metA)
		return untilLinksUp(t0, limit, metA, metB)
	}
	// resume kills a's WAN connections to b (the strangers' are left) and
	// returns the time until every link has resumed and is up.
	resume := func() time.Duration {
		before := wanMetricSum(metA, "mpi5k_wan_resumes_total")
		t0 := time.Now()
		out, err := exec.Command("ss", "-K", "-t", "-n", "dst", wanB.String(), "and", "(", "src", ipA.String(), "or", "src", "127.0.0.1", ")").CombinedOutput()
		if err != nil {
			t.Fatalf("ss -K: %v: %s", err, out)
		}
		for wanMetricSum(metA, "mpi5k_wan_resumes_total") < before+1 && time.Since(t0) < limit {
			time.Sleep(5 * time.Millisecond)
		}
		return untilLinksUp(t0, limit, metA, metB)
	}
	baseUp, baseRes := restart(), resume()
	time.Sleep(500 * time.Millisecond)
	idleRSS, idleFDs := procRSS(b.Process.Pid), procFDs(b.Process.Pid)
	t.Logf("no flood: restarted peer's links up in %v, killed connections resumed in %v; gateway b RSS %d KiB, %d descriptors",
		baseUp.Round(time.Millisecond), baseRes.Round(time.Millisecond), idleRSS>>10, idleFDs)
	// What b's limits let the flood hold: MaxPendingWAN (16) and the
	// peer's own pool (4), the metrics server's 32, and slack for the
	// connection accepted and being reset and a's reconnecting links.
	fdBudget := idleFDs + 16 + 4 + 32 + 8
	for _, sources := range []int{1, 16, 256} {
		var peakRSS, peakFDs atomic.Int64
		sdone := make(chan struct{})
		var swg sync.WaitGroup
		swg.Add(1)
		go func() {
			defer swg.Done()
			for {
				if r := procRSS(b.Process.Pid); r > peakRSS.Load() {
					peakRSS.Store(r)
				}
				if n := procFDs(b.Process.Pid); n > peakFDs.Load() {
					peakFDs.Store(n)
				}
				select {
				case <-sdone:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		cpu0 := procCPU(b.Process.Pid)
		stop := strangers(t, wanB, sources, 64)
		time.Sleep(time.Second) // the flood fills what it can
		up, res := restart(), resume()
		n := stop()
		cpu := procCPU(b.Process.Pid) - cpu0
		close(sdone)
		swg.Wait()
		t.Logf("%3d sources, %6d connections: restarted peer's links up in %v, killed connections resumed in %v; b's peak RSS %d KiB (+%d), %d descriptors (+%d), CPU %v",
			sources, n, up.Round(time.Millisecond), res.Round(time.Millisecond),
			peakRSS.Load()>>10, (peakRSS.Load()-idleRSS)>>10, peakFDs.Load(), peakFDs.Load()-idleFDs, cpu.Round(10*time.Millisecond))
		if up > baseUp+time.Second || res > baseRes+time.Second {
			t.Errorf("%d stranger sources: links up in %v (%v without the flood), resumed in %v (%v without)", sources, up, baseUp, res, baseRes)
		}
		if peakRSS.Load() > idleRSS+64<<20 {
			t.Errorf("%d stranger sources: b's RSS rose from %d to %d KiB", sources, idleRSS>>10, peakRSS.Load()>>10)
		}
		if peakFDs.Load() > fdBudget {
			t.Errorf("%d stranger sources: b held %d descriptors, over its budget of %d", sources, peakFDs.Load(), fdBudget)
		}
	}
}

// untilLinksUp waits up to limit, from start, until every link the
// gateways at the metrics addresses ms list is up, and returns how long
// it took (limit if they were not).
func untilLinksUp(start time.Time, limit time.Duration, ms ...netip.AddrPort) time.Duration {
	for time.Since(start) < limit {
		up := true
		for _, m := range ms {
			n, all := linksUpAt(m)
			up = up && n > 0 && all
		}
		if up {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return limit
}

var scrapeClient = &http.Client{Timeout: time.Second}

// linksUpAt reads mpi5k_wan_link_up from the metrics at m: how many links
// it lists, and whether each is up.
func linksUpAt(m netip.AddrPort) (int, bool) {
	n, all := 0, true
	scrapeLines(m, "mpi5k_wan_link_up{", func(v float64) {
		n++
		all = all && v == 1
	})
	return n, all
}

// wanMetricSum is the sum of the series of name at m.
func wanMetricSum(m netip.AddrPort, name string) float64 {
	var s float64
	scrapeLines(m, name+"{", func(v float64) { s += v })
	return s
}

func scrapeLines(m netip.AddrPort, prefix string, f func(float64)) {
	resp, err := scrapeClient.Get("http://" + m.String() + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				f(v)
			}
		}
	}
}

// procRSS is VmRSS of process pid, in bytes (0 once it is gone). It
// takes no *testing.T: flood goroutines call it.
func procRSS(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// procFDs is the descriptors process pid holds.
func procFDs(pid int) int64 {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return int64(len(es))
}

// strangers floods target from sources addresses of 127.78.0.0/16 with
// workers connections at a time, each of one kind (testnet.Flood), held
// until the gateway ends it or 4 s pass, closed with a reset as a flood
// does. stop ends it and returns the connections made.
func strangers(t *testing.T, target netip.AddrPort, sources, workers int) (stop func() int64) {
	return testnet.Flood{Target: target, Sources: sources, Workers: workers,
		Source: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 78, byte(i / 250), byte(i%250 + 1)}) },
		Hello:  testnet.ClientHello(t, "mpi5k/2"), Junk: 256, Seed: 11, Reset: true}.Start()
}
