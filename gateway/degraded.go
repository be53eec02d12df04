package gateway

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// What a gateway runs without. mpi5k_degraded{reason} carries the short
// code (a bounded label value); the sentence, for people, is in the log,
// in /ready's answer and, through DegradedText, on one line of `mpi5k
// run`'s summary, so a user who never reads the gateway's log still
// learns that, and why, the job ran with less than mpi5k can do.
const (
	degradedTimers      = "rto_floor"
	degradedBBR         = "no_bbr"
	degradedCubic       = "no_cubic"
	degradedWarm        = "not_warm"
	degradedWarmUnknown = "warm_unknown"
)

var degradedTexts = map[string]string{
	degradedTimers:      "WAN RTO floor 200ms, not 10ms: the kernel lacks TCP_RTO_MIN_US (Linux 6.15 or newer)",
	degradedBBR:         "bulk WAN links on the default congestion control, not BBR: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)",
	degradedCubic:       "express link not on CUBIC: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)",
	degradedWarm:        "express link not kept warm: net.ipv4.tcp_slow_start_after_idle is not 0 on the gateway host",
	degradedWarmUnknown: "express link perhaps not kept warm: net.ipv4.tcp_slow_start_after_idle unreadable",
}

// DegradedText is the sentence for a reason of mpi5k_degraded (the
// reason itself if this build does not know it).
func DegradedText(reason string) string {
	if t, ok := degradedTexts[reason]; ok {
		return t
	}
	return reason
}

func (g *Gateway) degrade(reason string) {
	g.degradedMu.Lock()
	defer g.degradedMu.Unlock()
	for _, w := range g.degraded {
		if w == reason {
			return
		}
	}
	g.degraded = append(g.degraded, reason)
}

// Degraded lists the reasons of what the gateway runs without.
func (g *Gateway) Degraded() []string {
	g.degradedMu.Lock()
	defer g.degradedMu.Unlock()
	return append([]string(nil), g.degraded...)
}

// degradedCollector exports mpi5k_degraded{reason} = 1 per degradation.
type degradedCollector struct{ g *Gateway }

var degradedDesc = prometheus.NewDesc("mpi5k_degraded",
	"1 for each feature the gateway runs without, by reason code (docs/operations.md lists them; the log and /ready say it in words).", []string{"reason"}, nil)

func (c degradedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- degradedDesc }

func (c degradedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.g.Degraded() {
		ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, 1, w)
	}
}

// Version is the build's version, set by the command (mpi5k_build_info).
var Version = "dev"

// buildInfo is mpi5k_build_info: 1, labelled with what the process runs.
func buildInfo() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mpi5k_build_info",
		Help:        "1, labelled with the gateway's version and Go toolchain.",
		ConstLabels: prometheus.Labels{"version": Version, "goversion": runtime.Version()}}, func() float64 { return 1 })
}
