package gateway

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/gateway/degraded"
	"github.com/mpi5k/mpi5k/tuning"
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

// checkKernel checks the WAN settings against what the kernel offers and
// allows this process, and settles the congestion controls left to it:
// what it cannot have, and says so (c.Logger), is what the gateway runs
// without (package degraded's reasons); what it cannot have at all is
// the error.
func (c *Config) checkKernel() (without []string, err error) {
	if err := c.WAN.CheckTimers(); errors.Is(err, unix.ENOPROTOOPT) {
		without = append(without, degraded.RTOFloor)
		c.Logger.Warn("this kernel has no TCP_RTO_MIN_US / TCP_DELACK_MAX_US (Linux 6.15 or newer has them): WAN sockets keep the 200 ms RTO floor, and a lone lost message waits about 200 ms more",
			"wan_rto_min", c.WAN.RTOMin, "wan_delack_max", c.WAN.DelackMax)
		c.WAN.RTOMin, c.WAN.DelackMax = 0, 0
	} else if errors.Is(err, unix.EINVAL) {
		return nil, fmt.Errorf("gateway: --wan-rto-min %v / --wan-delack-max %v: %w (the kernel takes more than one clock tick, 4 ms at HZ=250, and at most 200 ms)",
			c.WAN.RTOMin, c.WAN.DelackMax, err)
	} else if err != nil {
		return nil, fmt.Errorf("gateway: WAN timers: %w", err)
	}
	// The defaults below need a CC this process may set (CheckCC); when the
	// kernel offers it but tcp_allowed_congestion_control keeps it from a
	// process without CAP_NET_ADMIN, the gateway says so and falls back.
	if c.WAN.CC == "" {
		// BBR keeps the bottleneck queue short (small messages behind bulk
		// wait less) and, unlike CUBIC, kept the aggregated link near line
		// rate in the lab with TCP_NOTSENT_LOWAT (200 Mbit/s, 20 ms:
		// 97-101 % of direct vs 63 % with CUBIC on shared cores).
		if err := tuning.CheckCC("bbr"); err == nil {
			c.WAN.CC = "bbr"
		} else if errors.Is(err, unix.EPERM) {
			c.Logger.Warn("WAN sockets keep the system's default congestion control instead of BBR", "err", err)
			without = append(without, degraded.NoBBR)
		}
	}
	if c.ExpressCC == "" && c.WAN.CC != "" {
		// A BBR socket carrying one message per round trip paces it at the
		// rate of such app-limited samples: in the lab a 16 KiB ping-pong
		// took 17.0 ms per half round trip over BBR vs 10.6 ms direct and
		// over a CUBIC express link (bench/figures/express). Primed,
		// BBR sends messages at the path's rate and holds its window against
		// a competing BBR flow; but the primed estimate ages out of BBR's
		// 10-round filter, and under random loss the first sample that is
		// not app-limited, a message's retransmission, replaces it: 196 ->
		// 2.6 Mbit/s after one loss at 0.1 %, then ~23 (64 KiB ping-pong 62
		// ms where CUBIC with renewal takes 26; bench/figures/bbrexpress).
		if err := tuning.CheckCC("cubic"); err == nil {
			c.ExpressCC = "cubic"
		} else if errors.Is(err, unix.EPERM) {
			c.Logger.Warn("the express link runs "+c.WAN.CC+" instead of CUBIC", "err", err)
			without = append(without, degraded.NoCubic)
		}
	}
	for _, cc := range []string{c.LAN.CC, c.WAN.CC, c.ExpressCC} {
		if err := tuning.CheckCC(cc); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	return without, nil
}
