package wrap

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	gw "github.com/mpi5k/mpi5k/gateway"
)

// Metric names the summary reads from each gateway's /metrics (exported by
// package gateway). Each carries a "peer" label naming the remote site;
// bytes also a "dir" label (tx, rx), streams (out, in).
const (
	metricBytes       = "mpi5k_wan_bytes_total"
	metricStreams     = "mpi5k_streams_opened_total"
	metricRetransmits = "mpi5k_wan_tcp_retransmits_total"
	// Derived by the gateway from periodic TCP_INFO samples (tcpinfo).
	metricRetransRTO   = "mpi5k_wan_tcp_retransmits_rto_total"
	metricRTOs         = "mpi5k_wan_tcp_rtos_total"
	metricIdleRestarts = "mpi5k_wan_tcp_idle_restarts_total"
	// Only WAN sockets running BBR export these.
	metricProbeRTTs = "mpi5k_wan_bbr_probe_rtt_total"
	metricSkips     = "mpi5k_wan_bbr_probe_rtt_skips_total"
	// Only gateways with an express link that renews, and with resume on.
	metricRenewals = "mpi5k_wan_express_renewals_total"
	metricYields   = "mpi5k_wan_express_yields_total"
	metricResumes  = "mpi5k_wan_resumes_total"
	// The process's user + system CPU time (Prometheus' process collector).
	metricCPU = "process_cpu_seconds_total"
)

// GatewayTag starts the summary's machine-readable line per gateway:
// "MPI5K-GATEWAY site=S cpu_s=F wan_bytes=N cpu_total_s=F renewals=N
// yields=N": CPU seconds (user + system) and WAN bytes sent plus received
// while the job ran, CPU seconds since the gateway started (priming
// included), and the express link's renewals and yields (to another
// flow's queue) while the job ran, over all peers. mpi5k bench records
// them beside each run's time.
const GatewayTag = "MPI5K-GATEWAY"

// usage is one gateway's CPU time and WAN bytes (sent + received) at one
// moment; ok is false when its metrics could not be read.
type usage struct {
	cpu, wan         float64
	renewals, yields float64
	ok               bool
}

func usageOf(fams map[string]*dto.MetricFamily) usage {
	u := usage{ok: true}
	if f := fams[metricCPU]; f != nil && len(f.GetMetric()) > 0 {
		u.cpu = value(f.GetMetric()[0])
	} else {
		u.ok = false
	}
	for name, v := range map[string]*float64{metricBytes: &u.wan, metricRenewals: &u.renewals, metricYields: &u.yields} {
		if f := fams[name]; f != nil {
			for _, m := range f.GetMetric() {
				*v += value(m)
			}
		}
	}
	return u
}

// snapshot reads every gateway's usage, as the job starts.
func snapshot(gws []*gateway) []usage {
	us := make([]usage, len(gws))
	for i, g := range gws {
		if fams, err := scrape(g.metrics); err == nil {
			us[i] = usageOf(fams)
		}
	}
	return us
}

// cpuLines says what gateway site spent on the CPU during the job (start
// to end) and per GiB it forwarded, for people and for mpi5k bench.
func cpuLines(site string, start, end usage) []string {
	if !end.ok {
		return []string{fmt.Sprintf("  %s: no CPU time in its metrics", site)}
	}
	cpu, wan, during := end.cpu, end.wan, "since it started (no reading at the job's start)"
	renewals, yields := end.renewals, end.yields
	if start.ok {
		cpu, wan, during = end.cpu-start.cpu, end.wan-start.wan, "during the job"
		renewals, yields = end.renewals-start.renewals, end.yields-start.yields
	}
	line := fmt.Sprintf("  %s: %.2f s CPU (user+sys) %s, %.2f s since it started; ", site, cpu, during, end.cpu)
	// Below a MiB the quotient says more about the idle cost than about
	// forwarding.
	if wan >= 1<<20 {
		line += fmt.Sprintf("%.2f s per GiB forwarded (%s over the WAN)", cpu/(wan/(1<<30)), human(wan))
	} else {
		line += fmt.Sprintf("%s over the WAN, too little for a cost per GiB", human(wan))
	}
	return []string{line, fmt.Sprintf("  %s site=%s cpu_s=%.3f wan_bytes=%.0f cpu_total_s=%.3f renewals=%.0f yields=%.0f",
		GatewayTag, site, cpu, wan, end.cpu, renewals, yields)}
}

// pairStats is what one gateway says about its link to one peer site.
type pairStats struct {
	sent, recv, streams, retrans float64
	retransRTO, rtos, idle       float64
	dips, skips                  float64
	bbr                          bool // a link to the peer runs BBR
	renewals, resumes, yields    float64
	renews, resumable            bool // the gateway exports them
}

func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := httpClient(2 * time.Second).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// perPeer sums a metric family by its "peer" label into stats, keeping
// only samples whose "dir" label is dir when dir is set.
func perPeer(fams map[string]*dto.MetricFamily, name, dir string, stats map[string]*pairStats, field func(*pairStats) *float64) {
	f := fams[name]
	if f == nil {
		return
	}
	for _, m := range f.GetMetric() {
		peer, d := "", ""
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "peer":
				peer = l.GetValue()
			case "dir":
				d = l.GetValue()
			}
		}
		if peer == "" || (dir != "" && d != dir) {
			continue
		}
		st := stats[peer]
		if st == nil {
			st = &pairStats{}
			stats[peer] = st
		}
		*field(st) += value(m)
	}
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// summary scrapes every gateway once and prints, per gateway and peer
// site, the WAN bytes each way, the streams it opened and the WAN socket's
// retransmissions, then per gateway its CPU time since start (from
// snapshot; nil or short: none) and per GiB forwarded, and last the
// gateways that died during the job (live, may be nil).
func summary(gws []*gateway, start []usage, live *liveness) string {
	var b strings.Builder
	var lines []string
	degraded := map[string][]string{} // what the gateways run without -> sites
	var whats []string
	for i, g := range gws {
		fams, err := scrape(g.metrics)
		if err != nil {
			lines = append(lines, fmt.Sprintf("  %s: no metrics (%v)", g.label(), err))
			continue
		}
		if w := degradedOf(fams); w != "" {
			if degraded[w] == nil {
				whats = append(whats, w)
			}
			degraded[w] = append(degraded[w], g.site.Name)
		}
		stats := map[string]*pairStats{}
		perPeer(fams, metricBytes, "tx", stats, func(s *pairStats) *float64 { return &s.sent })
		perPeer(fams, metricBytes, "rx", stats, func(s *pairStats) *float64 { return &s.recv })
		perPeer(fams, metricStreams, "out", stats, func(s *pairStats) *float64 { return &s.streams })
		perPeer(fams, metricRetransmits, "", stats, func(s *pairStats) *float64 { return &s.retrans })
		perPeer(fams, metricRetransRTO, "", stats, func(s *pairStats) *float64 { return &s.retransRTO })
		perPeer(fams, metricRTOs, "", stats, func(s *pairStats) *float64 { return &s.rtos })
		perPeer(fams, metricIdleRestarts, "", stats, func(s *pairStats) *float64 { return &s.idle })
		perPeer(fams, metricProbeRTTs, "", stats, func(s *pairStats) *float64 { s.bbr = true; return &s.dips })
		perPeer(fams, metricSkips, "", stats, func(s *pairStats) *float64 { return &s.skips })
		perPeer(fams, metricRenewals, "", stats, func(s *pairStats) *float64 { s.renews = true; return &s.renewals })
		perPeer(fams, metricYields, "", stats, func(s *pairStats) *float64 { return &s.yields })
		perPeer(fams, metricResumes, "", stats, func(s *pairStats) *float64 { s.resumable = true; return &s.resumes })
		peers := make([]string, 0, len(stats))
		for p := range stats {
			peers = append(peers, p)
		}
		sort.Strings(peers)
		for _, p := range peers {
			st := stats[p]
			line := fmt.Sprintf("  %s -> %s: %s sent, %s received, %.0f streams opened, %.0f WAN retransmits (%.0f in RTO recovery), %.0f RTOs, %.0f idle restarts",
				g.label(), p, human(st.sent), human(st.recv), st.streams, st.retrans, st.retransRTO, st.rtos, st.idle)
			if st.bbr {
				// Each dip cost the link ~200 ms at 4 segments per RTT.
				line += fmt.Sprintf(", %.0f BBR PROBE_RTT dips (%.0f skipped)", st.dips, st.skips)
			}
			// Renewals follow losses on the express link; resumes are
			// breaks of a link's connection that no stream saw.
			if st.renews {
				line += fmt.Sprintf(", %.0f express link renewals", st.renewals)
			}
			// A yield sends the messages on the bulk links for a while,
			// because another flow keeps the WAN queue full.
			if st.yields > 0 {
				line += fmt.Sprintf(", messages on the bulk links %.0f times (another flow filled the WAN queue)", st.yields)
			}
			if st.resumable {
				line += fmt.Sprintf(", %.0f links resumed after a break", st.resumes)
			}
			lines = append(lines, line)
		}
		var u0 usage
		if i < len(start) {
			u0 = start[i]
		}
		lines = append(lines, cpuLines(g.label(), u0, usageOf(fams))...)
	}
	if len(whats) > 0 {
		// One line, whatever the number of gateways: sites that run
		// without the same features are named together.
		var parts []string
		for _, w := range whats {
			parts = append(parts, strings.Join(degraded[w], ", ")+": "+w)
		}
		lines = append(lines, "  degraded: "+strings.Join(parts, " | "))
	}
	if d := live.died(); d != "" {
		lines = append(lines, d)
	}
	if len(lines) == 0 {
		return ""
	}
	b.WriteString("mpi5k: gateway summary\n")
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}

func human(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", v, units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// metricDegraded is 1 per feature a gateway runs without; its label
// "reason" says which (package gateway, degraded.go, has the sentence).
const metricDegraded = "mpi5k_degraded"

// degradedOf joins a gateway's degradations ("" if none).
func degradedOf(fams map[string]*dto.MetricFamily) string {
	f := fams[metricDegraded]
	if f == nil {
		return ""
	}
	var whats []string
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" && value(m) > 0 {
				whats = append(whats, gw.DegradedText(l.GetValue()))
			}
		}
	}
	sort.Strings(whats)
	return strings.Join(whats, "; ")
}
