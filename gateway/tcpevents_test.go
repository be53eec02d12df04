package gateway

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/tuning"
)

// TestWANEventMetrics: the WAN sockets are sampled periodically and the
// derived event counters appear in /metrics for every link.
func TestWANEventMetrics(t *testing.T) {
	_, a, _ := startPair(t, nil)
	time.Sleep(5 * wanSampleEvery)
	n := len(a.allLinks())
	if got := counter(t, a, "mpi5k_wan_tcp_samples_total"); got < float64(2*n) {
		t.Fatalf("%v samples over %d links after %v, want >= 2 per link", got, n, 5*wanSampleEvery)
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
