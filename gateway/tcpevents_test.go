package gateway

import (
	"testing"
	"time"
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
