package wrap

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/gateway/degraded"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
	// All at once: the launcher waits for the slowest, and a gateway of
	// many peers takes tens of milliseconds to gather its series.
	us := make([]usage, len(gws))
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if fams, err := scrape(g.metrics); err == nil {
				us[i] = usageOf(fams)
			}
		}()
	}
	wg.Wait()
	return us
}

// setUsage sets the gateway's CPU and WAN bytes from its usage at the
// job's start (if read) and end.
func (g *GatewaySummary) setUsage(start, end usage) {
	g.cpuKnown = end.ok
	g.CPUSeconds, g.WANBytes, g.CPUTotalSeconds = end.cpu, end.wan, end.cpu
	g.Renewals, g.Yields = end.renewals, end.yields
	if start.ok {
		g.JobWindow = true
		g.CPUSeconds, g.WANBytes = end.cpu-start.cpu, end.wan-start.wan
		g.Renewals, g.Yields = end.renewals-start.renewals, end.yields-start.yields
	}
}

// cpuLines says what the gateway spent on the CPU during the job (start
// to end) and per GiB it forwarded, for people and for mpi5k bench.
func (g GatewaySummary) cpuLines() []string {
	if !g.cpuKnown {
		return []string{fmt.Sprintf("  %s: no CPU time in its metrics", g.Label)}
	}
	cpu, wan, during := g.CPUSeconds, g.WANBytes, "since it started (no reading at the job's start)"
	if g.JobWindow {
		during = "during the job"
	}
	line := fmt.Sprintf("  %s: %.2f s CPU (user+sys) %s, %.2f s since it started; ", g.Label, cpu, during, g.CPUTotalSeconds)
	// Below a MiB the quotient says more about the idle cost than about
	// forwarding.
	if wan >= 1<<20 {
		line += fmt.Sprintf("%.2f s per GiB forwarded (%s over the WAN)", cpu/(wan/(1<<30)), human(wan))
	} else {
		line += fmt.Sprintf("%s over the WAN, too little for a cost per GiB", human(wan))
	}
	return []string{line, fmt.Sprintf("  %s site=%s cpu_s=%.3f wan_bytes=%.0f cpu_total_s=%.3f renewals=%.0f yields=%.0f",
		GatewayTag, g.Label, cpu, wan, g.CPUTotalSeconds, g.Renewals, g.Yields)}
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

// Summary is what the gateways did during a job, as `mpi5k run` prints
// it and writes it with --summary-json.
type Summary struct {
	Gateways []GatewaySummary `json:"gateways"`
	// Degraded: what gateways ran without, in words, and the sites.
	Degraded []DegradedSites `json:"degraded,omitempty"`
	// Died: the gateways that failed during the job, and why.
	Died []DiedGateway `json:"died,omitempty"`
	// LauncherStatus is the exit status of the MPI launcher (mpi5k run's
	// own status, unless a gateway failed: 75).
	LauncherStatus int `json:"launcher_status"`
}

// GatewaySummary is one gateway's part.
type GatewaySummary struct {
	Site  string        `json:"site"`
	Label string        `json:"gateway"` // site, or site@host for a site's further gateways
	Error string        `json:"error,omitempty"`
	Peers []PeerSummary `json:"peers,omitempty"`
	// CPU seconds (user + system) and WAN bytes while the job ran (since
	// the gateway started when JobWindow is false), CPU since start.
	CPUSeconds      float64 `json:"cpu_s"`
	CPUTotalSeconds float64 `json:"cpu_total_s"`
	WANBytes        float64 `json:"wan_bytes"`
	JobWindow       bool    `json:"job_window"`
	Renewals        float64 `json:"express_renewals"`
	Yields          float64 `json:"express_yields"`
	cpuKnown        bool
}

// PeerSummary is what one gateway says about its links to one peer site.
type PeerSummary struct {
	Peer           string   `json:"peer"`
	BytesSent      float64  `json:"bytes_sent"`
	BytesReceived  float64  `json:"bytes_received"`
	StreamsOpened  float64  `json:"streams_opened"`
	Retransmits    float64  `json:"wan_retransmits"`
	RetransmitsRTO float64  `json:"wan_retransmits_rto"`
	RTOs           float64  `json:"wan_rtos"`
	IdleRestarts   float64  `json:"wan_idle_restarts"`
	ProbeRTTs      *float64 `json:"bbr_probe_rtt,omitempty"` // BBR links only
	ProbeRTTSkips  *float64 `json:"bbr_probe_rtt_skips,omitempty"`
	Renewals       *float64 `json:"express_renewals,omitempty"`
	Yields         float64  `json:"express_yields"`
	Resumes        *float64 `json:"resumes,omitempty"` // gateways with resume on
}

// DegradedSites is one set of degradations and the sites that ran with it.
type DegradedSites struct {
	What  string   `json:"what"`
	Sites []string `json:"sites"`
}

// DiedGateway is a gateway that failed during the job.
type DiedGateway struct {
	Gateway string `json:"gateway"`
	Host    string `json:"host"`
	Site    string `json:"site"`
	Why     string `json:"why"`
}

// collect scrapes every gateway once: per gateway and peer site the WAN
// bytes each way, the streams it opened and the WAN socket's
// retransmissions, per gateway its CPU time since start (from snapshot;
// nil or short: none), and last the gateways that died during the job
// (live, may be nil).
func collect(gws []*gateway, start []usage, live *liveness) Summary {
	var sum Summary
	degraded := map[string]int{} // what -> its index in sum.Degraded
	for i, g := range gws {
		gs := GatewaySummary{Site: g.site.Name, Label: g.label()}
		fams, err := scrape(g.metrics)
		if err != nil {
			gs.Error = fmt.Sprintf("no metrics (%v)", err)
			sum.Gateways = append(sum.Gateways, gs)
			continue
		}
		if w := degradedOf(fams); w != "" {
			if _, ok := degraded[w]; !ok {
				degraded[w] = len(sum.Degraded)
				sum.Degraded = append(sum.Degraded, DegradedSites{What: w})
			}
			d := &sum.Degraded[degraded[w]]
			d.Sites = append(d.Sites, g.site.Name)
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
			ps := PeerSummary{Peer: p, BytesSent: st.sent, BytesReceived: st.recv, StreamsOpened: st.streams,
				Retransmits: st.retrans, RetransmitsRTO: st.retransRTO, RTOs: st.rtos, IdleRestarts: st.idle, Yields: st.yields}
			if st.bbr {
				ps.ProbeRTTs, ps.ProbeRTTSkips = &st.dips, &st.skips
			}
			if st.renews {
				ps.Renewals = &st.renewals
			}
			if st.resumable {
				ps.Resumes = &st.resumes
			}
			gs.Peers = append(gs.Peers, ps)
		}
		var u0 usage
		if i < len(start) {
			u0 = start[i]
		}
		gs.setUsage(u0, usageOf(fams))
		sum.Gateways = append(sum.Gateways, gs)
	}
	if live != nil {
		for _, f := range live.dead {
			sum.Died = append(sum.Died, DiedGateway{Gateway: f.g.label(), Host: f.g.hostName(), Site: f.g.site.Name, Why: f.why})
		}
	}
	return sum
}

// summary is collect's result as the lines `mpi5k run` prints on stderr
// ("" when there is nothing to say).
func summary(gws []*gateway, start []usage, live *liveness) string {
	return collect(gws, start, live).Text()
}

// Text renders the summary for people; the MPI5K-GATEWAY lines are for
// mpi5k bench.
func (sum Summary) Text() string {
	var lines []string
	for _, g := range sum.Gateways {
		if g.Error != "" {
			lines = append(lines, fmt.Sprintf("  %s: %s", g.Label, g.Error))
			continue
		}
		for _, st := range g.Peers {
			line := fmt.Sprintf("  %s -> %s: %s sent, %s received, %.0f streams opened, %.0f WAN retransmits (%.0f in RTO recovery), %.0f RTOs, %.0f idle restarts",
				g.Label, st.Peer, human(st.BytesSent), human(st.BytesReceived), st.StreamsOpened, st.Retransmits, st.RetransmitsRTO, st.RTOs, st.IdleRestarts)
			if st.ProbeRTTs != nil {
				// Each dip cost the link ~200 ms at 4 segments per RTT.
				line += fmt.Sprintf(", %.0f BBR PROBE_RTT dips (%.0f skipped)", *st.ProbeRTTs, *st.ProbeRTTSkips)
			}
			// Renewals follow losses on the express link; resumes are
			// breaks of a link's connection that no stream saw.
			if st.Renewals != nil {
				line += fmt.Sprintf(", %.0f express link renewals", *st.Renewals)
			}
			// A yield sends the messages on the bulk links for a while,
			// because another flow keeps the WAN queue full.
			if st.Yields > 0 {
				line += fmt.Sprintf(", messages on the bulk links %.0f times (another flow filled the WAN queue)", st.Yields)
			}
			if st.Resumes != nil {
				line += fmt.Sprintf(", %.0f links resumed after a break", *st.Resumes)
			}
			lines = append(lines, line)
		}
		lines = append(lines, g.cpuLines()...)
	}
	if len(sum.Degraded) > 0 {
		// One line, whatever the number of gateways: sites that run
		// without the same features are named together.
		var parts []string
		for _, d := range sum.Degraded {
			parts = append(parts, strings.Join(d.Sites, ", ")+": "+d.What)
		}
		lines = append(lines, "  degraded: "+strings.Join(parts, " | "))
	}
	if len(sum.Died) > 0 {
		parts := make([]string, len(sum.Died))
		for i, d := range sum.Died {
			parts[i] = fmt.Sprintf("%s (host %s, site %s) %s", d.Gateway, d.Host, d.Site, d.Why)
		}
		lines = append(lines, "  died during the job: "+strings.Join(parts, "; "))
	}
	if len(lines) == 0 {
		return ""
	}
	var b strings.Builder
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
				whats = append(whats, degraded.Text(l.GetValue()))
			}
		}
	}
	sort.Strings(whats)
	return strings.Join(whats, "; ")
}
