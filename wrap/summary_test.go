package wrap

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/mpi5k/mpi5k/gateway/degraded"
)

// TestSummary: the summary sums each gateway's link series per peer site
// and adds BBR's PROBE_RTT dips and skips only for peers reached over BBR
// links, and express renewals and resumes only where they are exported, then each gateway's CPU time during the job (from the reading at
// its start) and per GiB forwarded; a gateway without metrics gets a line
// saying so.
func TestSummary(t *testing.T) {
	const text = `# TYPE mpi5k_wan_bytes_total counter
mpi5k_wan_bytes_total{dir="tx",link="0",peer="b",site="a"} 3145728
mpi5k_wan_bytes_total{dir="tx",link="1",peer="b",site="a"} 1048576
mpi5k_wan_bytes_total{dir="rx",link="0",peer="b",site="a"} 1024
mpi5k_wan_bytes_total{dir="tx",link="0",peer="c",site="a"} 10
# TYPE mpi5k_streams_opened_total counter
mpi5k_streams_opened_total{dir="out",peer="b"} 7
mpi5k_streams_opened_total{dir="in",peer="b"} 2
# TYPE mpi5k_wan_tcp_retransmits_total counter
mpi5k_wan_tcp_retransmits_total{link="0",peer="b",site="a"} 5
mpi5k_wan_tcp_retransmits_total{link="1",peer="b",site="a"} 1
# TYPE mpi5k_wan_bbr_probe_rtt_total counter
mpi5k_wan_bbr_probe_rtt_total{link="0",peer="b",site="a"} 1
# TYPE mpi5k_wan_bbr_probe_rtt_skips_total counter
mpi5k_wan_bbr_probe_rtt_skips_total{link="0",peer="b",site="a"} 4
# TYPE mpi5k_wan_express_renewals_total counter
mpi5k_wan_express_renewals_total{peer="b",site="a"} 3
# TYPE mpi5k_wan_express_yields_total counter
mpi5k_wan_express_yields_total{peer="b",site="a"} 2
# TYPE mpi5k_wan_resumes_total counter
mpi5k_wan_resumes_total{link="0",peer="b",site="a"} 1
mpi5k_wan_resumes_total{link="1",peer="b",site="a"} 1
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 2.5
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, text) }))
	defer srv.Close()
	up := strings.TrimPrefix(srv.URL, "http://")
	dead := "127.0.0.1:1"
	start := []usage{{cpu: 0.5, wan: 1 << 20, ok: true}, {}}
	out := summary([]*gateway{{site: &Site{Name: "a"}, metrics: up}, {site: &Site{Name: "z"}, metrics: dead}}, start, nil)
	for _, want := range []string{
		"  a -> b: 4.0 MiB sent, 1.0 KiB received, 7 streams opened, 6 WAN retransmits (0 in RTO recovery), 0 RTOs, 0 idle restarts, 1 BBR PROBE_RTT dips (4 skipped), 3 express link renewals, messages on the bulk links 2 times (another flow filled the WAN queue), 2 links resumed after a break\n",
		"  a -> c: 10 B sent, 0 B received, 0 streams opened, 0 WAN retransmits (0 in RTO recovery), 0 RTOs, 0 idle restarts\n",
		// 2.0 s over 3,146,762 bytes (tx + rx since the start).
		"  a: 2.00 s CPU (user+sys) during the job, 2.50 s since it started; 682.44 s per GiB forwarded (3.0 MiB over the WAN)\n",
		"  MPI5K-GATEWAY site=a cpu_s=2.000 wan_bytes=3146762 cpu_total_s=2.500 renewals=3 yields=2\n",
		"  z: no metrics (",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestCPULines: without a reading at the job's start the line says the
// figures run from the gateway's start; under a MiB forwarded it gives no
// cost per GiB; a gateway whose metrics lack the CPU counter says so.
func TestCPULines(t *testing.T) {
	for _, c := range []struct {
		start, end usage
		want       []string
	}{
		{usage{}, usage{cpu: 2, wan: 1.5 * (1 << 30), renewals: 4, yields: 1, ok: true}, []string{
			"  a: 2.00 s CPU (user+sys) since it started (no reading at the job's start), 2.00 s since it started; 1.33 s per GiB forwarded (1.5 GiB over the WAN)",
			"  MPI5K-GATEWAY site=a cpu_s=2.000 wan_bytes=1610612736 cpu_total_s=2.000 renewals=4 yields=1"}},
		{usage{cpu: 1, wan: 100, renewals: 2, ok: true}, usage{cpu: 1.25, wan: 1124, renewals: 5, yields: 2, ok: true}, []string{
			"  a: 0.25 s CPU (user+sys) during the job, 1.25 s since it started; 1.0 KiB over the WAN, too little for a cost per GiB",
			"  MPI5K-GATEWAY site=a cpu_s=0.250 wan_bytes=1024 cpu_total_s=1.250 renewals=3 yields=2"}},
		{usage{}, usage{}, []string{"  a: no CPU time in its metrics"}},
	} {
		g := GatewaySummary{Label: "a"}
		g.setUsage(c.start, c.end)
		if got := g.cpuLines(); !slices.Equal(got, c.want) {
			t.Errorf("cpuLines(%+v, %+v):\n got %q\nwant %q", c.start, c.end, got, c.want)
		}
	}
}

// TestSummaryDegraded: the gateways' degradations make one line, sites
// with the same ones named together.
func TestSummaryDegraded(t *testing.T) {
	serve := func(text string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, text) }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	const two = "# TYPE mpi5k_degraded gauge\nmpi5k_degraded{reason=\"no_bbr\"} 1\nmpi5k_degraded{reason=\"not_warm\"} 1\n"
	gws := []*gateway{{site: &Site{Name: "a"}, metrics: serve(two)}, {site: &Site{Name: "b"}, metrics: serve(two)},
		{site: &Site{Name: "c"}, metrics: serve("# TYPE mpi5k_degraded gauge\nmpi5k_degraded{reason=\"not_warm\"} 1\n")},
		{site: &Site{Name: "d"}, metrics: serve("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n")}}
	out := summary(gws, nil, nil)
	if n := strings.Count(out, "degraded"); n != 1 {
		t.Errorf("%d lines mention degraded, want 1:\n%s", n, out)
	}
	bbr, warm := degraded.Text("no_bbr"), degraded.Text("not_warm")
	if want := "  degraded: a, b: " + bbr + "; " + warm + " | c: " + warm + "\n"; !strings.Contains(out, want) {
		t.Errorf("summary lacks %q:\n%s", want, out)
	}
}
