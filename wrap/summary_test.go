package wrap

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSummary: the summary sums each gateway's link series per peer site
// and adds BBR's PROBE_RTT dips and skips only for peers reached over BBR
// links; a gateway without metrics gets a line saying so.
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
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, text) }))
	defer srv.Close()
	up := strings.TrimPrefix(srv.URL, "http://")
	dead := "127.0.0.1:1"
	out := summary([]*gateway{{site: &Site{Name: "a"}, metrics: up}, {site: &Site{Name: "z"}, metrics: dead}})
	for _, want := range []string{
		"  a -> b: 4.0 MiB sent, 1.0 KiB received, 7 streams opened, 6 WAN retransmits (0 in RTO recovery), 0 RTOs, 0 idle restarts, 1 BBR PROBE_RTT dips (4 skipped)\n",
		"  a -> c: 10 B sent, 0 B received, 0 streams opened, 0 WAN retransmits (0 in RTO recovery), 0 RTOs, 0 idle restarts\n",
		"  z: no metrics (",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}
