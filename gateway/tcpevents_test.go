package gateway

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/tuning"
)

// TestWANEventMetrics: the WAN sockets are sampled and the derived event
// counters appear in /metrics for every link.
func TestWANEventMetrics(t *testing.T) {
	_, a, _ := startPair(t, nil)
	time.Sleep(5 * wanSampleEvery)
	n := len(a.allLinks())
	if got := counter(t, a, "mpi5k_wan_tcp_samples_total"); got < float64(n) {
		t.Fatalf("%v samples over %d links after %v, want >= 1 per link", got, n, 5*wanSampleEvery)
	}
	mfs, err := a.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"mpi5k_wan_tcp_retransmits_fast_total": false, "mpi5k_wan_tcp_retransmits_rto_total": false,
		"mpi5k_wan_tcp_rtos_total": false, "mpi5k_wan_tcp_idle_restarts_total": false}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; ok && len(mf.GetMetric()) == n {
			want[mf.GetName()] = true
		}
	}
	for name, ok := range want {
		if !ok {
			t.Errorf("%s missing or not one series per link", name)
		}
	}
}

// TestWANSampleSkipsQuietLinks: a link with nothing in flight that has
// carried no frame since its last sample is not sampled again; one that
// carries bytes is.
func TestWANSampleSkipsQuietLinks(t *testing.T) {
	_, a, _ := startPair(t, nil)
	time.Sleep(2 * wanSampleEvery)
	links := a.allLinks()
	n := float64(len(links))
	samples := func() float64 { return counter(t, a, "mpi5k_wan_tcp_samples_total") }
	before := samples()
	for range 20 {
		a.m.ev.sample(links)
	}
	// A keepalive crossing meanwhile may bring a link back once.
	if d := samples() - before; d > n {
		t.Fatalf("20 rounds over %v quiet links took %v samples, want at most one per link", n, d)
	}
	c, err := lanOpen(a.LANAddr(), nodeA, testnet.Echo(t, nodeB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	before = samples()
	a.m.ev.sample(links)
	if d := samples() - before; d < 1 {
		t.Fatal("a link that carried a message since its last sample was not sampled")
	}
}

// TestWANBBRMetrics: a bulk link running BBR exports BBR's model and its
// PROBE_RTT counters and the PROBE_RTT guard's; the express link (CUBIC)
// exports none.
func TestWANBBRMetrics(t *testing.T) {
	if err := tuning.CheckCC("bbr"); err != nil {
		t.Skip(err)
	}
	_, a, b := startPair(t, func(c *Config) { c.WAN.CC, c.ExpressCC = "bbr", "cubic" })
	c, err := lanOpen(a.LANAddr(), nodeA, testnet.Serve(t, nodeB, echoServer))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Bulk, so BBR has a bandwidth sample on the bulk links.
	go c.Write(make([]byte, 4<<20))
	if _, err := io.ReadFull(c, make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * wanSampleEvery)
	for _, g := range []*testGW{a, b} {
		bulk := len(g.allLinks()) - 1 // one express link
		mfs, err := g.m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if v := m.GetCounter().GetValue() + m.GetGauge().GetValue(); v > 0 || strings.HasSuffix(mf.GetName(), "_total") {
					got[mf.GetName()]++
				}
			}
		}
		for _, name := range []string{"mpi5k_wan_bbr_min_rtt_seconds", "mpi5k_wan_bbr_bandwidth_bytes_per_second", "mpi5k_wan_bbr_probe_rtt_total",
			"mpi5k_wan_bbr_holds_total", "mpi5k_wan_bbr_probe_rtt_skips_total", "mpi5k_wan_bbr_hold_seconds_total"} {
			if got[name] != bulk {
				t.Errorf("%s: %d series (non-zero for the gauges), want %d (the bulk links)", name, got[name], bulk)
			}
		}
	}
}

// TestWANSamplerIdles: once no link has changed for wanIdleAfter samples,
// the sampler wakes about once per wanSampleIdle instead of every
// wanSampleEvery, and the next frame a link sends wakes it at once.
func TestWANSamplerIdles(t *testing.T) {
	_, a, _ := startPair(t, nil)
	// Links up; with no streams they go quiet but for a keepalive every
	// few seconds here. A keepalive does not wake an idle sampler, but its
	// next round, up to wanSampleIdle later, sees the link changed and
	// rightly samples every wanSampleEvery again for wanIdleAfter rounds.
	// So the window counted is one that starts with the sampler idle and
	// in which, nor in the wanSampleIdle before it, no link carried a frame.
	frames := func() (n uint64) {
		for _, l := range a.allLinks() {
			n += l.Stats.FramesSent.Load() + l.Stats.FramesRecv.Load()
		}
		return n
	}
	const window = 1500 * time.Millisecond
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no quiet window in 30 s (sampler idle %v): the gateway never idled", a.m.ev.idle.Load())
		}
		f0 := frames()
		time.Sleep(wanSampleIdle + 100*time.Millisecond)
		if !a.m.ev.idle.Load() {
			continue
		}
		w0 := a.m.ev.wakes.Load()
		time.Sleep(window)
		n := a.m.ev.wakes.Load() - w0
		if frames() != f0 {
			continue
		}
		if n > 3 {
			t.Fatalf("the sampler woke %d times in %v on an idle gateway whose links carried nothing, want at most 3 (%v idle, %v busy)",
				n, window, wanSampleIdle, wanSampleEvery)
		}
		break
	}
	c, err := lanOpen(a.LANAddr(), nodeA, testnet.Echo(t, nodeB))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w1 := a.m.ev.wakes.Load()
	start := time.Now()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	for a.m.ev.wakes.Load() == w1 {
		if time.Since(start) > wanSampleIdle/2 {
			t.Fatalf("no sample %v after a link sent, with the sampler idle", time.Since(start))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("woken %v after the first frame", time.Since(start).Round(time.Millisecond))
}
