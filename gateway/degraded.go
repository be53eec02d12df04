package gateway

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// What a gateway runs without is a list of reasons (package
// gateway/degraded): in mpi5k_degraded{reason}, and in words in the log and
// /ready's answer.

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
