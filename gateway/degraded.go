package gateway

import "github.com/prometheus/client_golang/prometheus"

// What a gateway runs without, in the words of mpi5k_degraded{what=...}:
// `mpi5k run` puts them on one line of the job's summary, so a user who
// never reads the gateway's log still learns that, and why, the job ran
// with less than mpi5k can do.
const (
	degradedTimers      = "WAN RTO floor 200ms, not 10ms: the kernel lacks TCP_RTO_MIN_US (Linux 6.15 or newer)"
	degradedBBR         = "bulk WAN links on the default congestion control, not BBR: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)"
	degradedCubic       = "express link not on CUBIC: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)"
	degradedWarm        = "express link not kept warm: net.ipv4.tcp_slow_start_after_idle is not 0 on the gateway host"
	degradedWarmUnknown = "express link perhaps not kept warm: net.ipv4.tcp_slow_start_after_idle unreadable"
)

func (g *Gateway) degrade(what string) {
	g.degradedMu.Lock()
	defer g.degradedMu.Unlock()
	for _, w := range g.degraded {
		if w == what {
			return
		}
	}
	g.degraded = append(g.degraded, what)
}

// Degraded lists what the gateway runs without.
func (g *Gateway) Degraded() []string {
	g.degradedMu.Lock()
	defer g.degradedMu.Unlock()
	return append([]string(nil), g.degraded...)
}

// degradedCollector exports mpi5k_degraded{what} = 1 per degradation.
type degradedCollector struct{ g *Gateway }

var degradedDesc = prometheus.NewDesc("mpi5k_degraded",
	"1 for each feature the gateway runs without; the label says which and why.", []string{"what"}, nil)

func (c degradedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- degradedDesc }

func (c degradedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.g.Degraded() {
		ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, 1, w)
	}
}
