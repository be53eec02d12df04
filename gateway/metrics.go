package gateway

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/gateway/degraded"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
	"github.com/mpi5k/mpi5k/tuning"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics exports the gateway in Prometheus text format. Link counters
// live in relay.Stats (atomics on the hot path); a custom collector reads
// them at scrape time, so forwarding never touches a Prometheus object.
type metrics struct {
	g     *Gateway
	reg   *prometheus.Registry
	sited prometheus.Registerer // reg, adding the site label

	lanRefused      prometheus.Counter
	wanRefused      prometheus.Counter
	wanDialFailures prometheus.Counter
	streamsOpened   *prometheus.CounterVec
	peerQueries     *prometheus.CounterVec
	refusals        *prometheus.CounterVec

	bytes, pad, frames, writes, stalls, streams, up, rtt, rtts *prometheus.Desc
	polled, partial, inline                                    *prometheus.Desc
	clamp, peerClamp, queue, lifts                             *prometheus.Desc
	cwnd, ssthresh, srtt, retrans, lost, notsent               *prometheus.Desc
	// Derived from periodic TCP_INFO samples (tcpevents.go).
	ev                                        wanEvents
	samples, rtxFast, rtxRTO, rtos, idleRst   *prometheus.Desc
	renewals, yields                          *prometheus.Desc
	peerStreams, early                        *prometheus.Desc
	probeRTTs, probeRTTTime, bbrBW, bbrMinRTT *prometheus.Desc
	// The PROBE_RTT guard (tuning.ProbeGuard).
	holds, skips, held *prometheus.Desc
	// WAN resume (relay.Link.ResumeStats).
	down, resumes, replayed, replay *prometheus.Desc
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{g: g, reg: prometheus.NewRegistry()}
	m.lanRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "mpi5k_lan_refused_total",
		Help: "LAN connections reset by policy or protocol errors."})
	m.wanRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "mpi5k_wan_refused_total",
		Help: "WAN connections refused (unknown source, bad HELLO)."})
	m.wanDialFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "mpi5k_wan_dial_failures_total",
		Help: "Failed WAN dials or handshakes."})
	m.streamsOpened = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mpi5k_streams_opened_total",
		Help: "Streams opened, by peer gateway (its site, with /N for the site's gateway N > 0) and direction (out: from our LAN)."}, []string{"peer", "dir"})
	m.peerQueries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mpi5k_peer_queries_total",
		Help: "PEER_QUERY answers, by whether the connection was found."}, []string{"found"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mpi5k_refusals_total",
		Help: "Connections, streams and links refused or failed by policy, protocol or a limit (docs/limits.md), by reason."}, []string{"reason"})
	inUse := func(name, help string, v *atomic.Int64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	// Every series carries the gateway's site: the collector's own
	// descriptions name it themselves, the rest get it here.
	m.sited = prometheus.WrapRegistererWith(prometheus.Labels{"site": g.site.Name}, m.reg)
	m.sited.MustRegister(m.refusals, buildInfo(),
		inUse("mpi5k_lan_connections", "LAN connections open (limit: MaxLANConns).", &g.lanConns),
		inUse("mpi5k_lan_pending_connections", "LAN connections waiting for their first frame (limit: MaxPendingLAN).", &g.lanPending),
		inUse("mpi5k_lan_control_connections", "LAN control connections open (PEER_QUERY, LISTEN; limit per host: MaxSourceControl).", &g.lanControl),
		inUse("mpi5k_wan_pending_connections", "WAN connections in their handshake (TLS and HELLO), from every source.", &g.wanPending),
		inUse("mpi5k_wan_pending_shared_connections", "WAN connections in their handshake from sources that are no map gateway's address (limit: MaxPendingWAN).", &g.admit.nshared),
		inUse("mpi5k_rank_listeners", "Host:ports of this site where ranks listen (LISTEN): streams from other sites may reach them.", &g.listens.n))
	m.renewals = prometheus.NewDesc("mpi5k_wan_express_renewals_total",
		"Times the site pair's express link was replaced by a fresh connection because losses had cut its congestion window below one message.",
		[]string{"peer"}, prometheus.Labels{"site": g.site.Name})
	m.yields = prometheus.NewDesc("mpi5k_wan_express_yields_total",
		"Times this gateway sent its messages to the peer on the bulk links for a while, because another flow kept the WAN queue full (--wan-express-yield).",
		[]string{"peer"}, prometheus.Labels{"site": g.site.Name})
	m.peerStreams = prometheus.NewDesc("mpi5k_peer_streams_in", "Streams the peer site has open into this site (limit: MaxPeerStreams).",
		[]string{"peer"}, prometheus.Labels{"site": g.site.Name})
	m.early = prometheus.NewDesc("mpi5k_early_bytes", "DATA bytes from the peer site buffered for streams whose destination is not connected yet (limit: MaxEarly).",
		[]string{"peer"}, prometheus.Labels{"site": g.site.Name})
	lbl := []string{"peer", "link"}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(append([]string{}, lbl...), extra...), prometheus.Labels{"site": g.site.Name})
	}
	m.bytes = d("mpi5k_wan_bytes_total", "DATA payload bytes on the WAN link.", "dir")
	m.frames = d("mpi5k_wan_frames_total", "Frames on the WAN link.", "dir")
	m.polled = d("mpi5k_wan_frames_poll_thread_total", "Frames the relay's poller thread forwarded (small messages of quiet streams; see mpi5k_wan_frames_total).", "dir")
	m.partial = d("mpi5k_wan_poll_thread_partial_writes_total", "Frames the poller thread wrote of which the socket took only part.")
	m.inline = d("mpi5k_wan_frames_inline_total", "Frames a stream wrote itself because the link was idle, without a hand-off to the link's writer (see mpi5k_wan_frames_total).")
	m.pad = d("mpi5k_wan_pad_bytes_total", "PAD (filler) payload bytes on the WAN link: priming of a new BBR link (tuning.Prime).", "dir")
	m.writes = d("mpi5k_wan_writes_total", "writev calls on the WAN socket (frames/writes = batching).")
	m.stalls = d("mpi5k_window_stalls_total", "Times a stream waited for credit from the peer.")
	m.streams = d("mpi5k_open_streams", "Streams open on the link.")
	m.up = d("mpi5k_wan_link_up", "1 while the link is up (0 while down, waiting to resume, or failed).")
	m.down = d("mpi5k_wan_link_down_seconds", "How long the link's connection has been broken while it waits to resume (0: connected).")
	m.resumes = d("mpi5k_wan_resumes_total", "Times the link resumed on a new connection after a break, without losing a byte.")
	m.replayed = d("mpi5k_wan_replayed_bytes_total", "Bytes written again after resumes (what the peer had not received).")
	m.replay = d("mpi5k_wan_replay_bytes", "Bytes the link keeps until the peer acknowledges them (limit: ReplayMax for bulk).")
	m.rtt = d("mpi5k_wan_ping_rtt_seconds", "Last PING round trip through the link.")
	m.rtts = d("mpi5k_wan_frame_rtt_seconds", "Round trips of PING frames through the link (about one a second on a busy link): queued behind the link's data in both gateways like any frame, what a message waits crossing the trunk and back.")
	m.clamp = d("mpi5k_wan_window_clamp_bytes", "Receive-window cap this gateway asks of the peer for the link (queue control; 0 = none).")
	m.peerClamp = d("mpi5k_wan_peer_window_clamp_bytes", "Receive-window cap the peer asked of this gateway's socket (0 = none).")
	m.queue = d("mpi5k_wan_queue_delay_seconds", "Standing queue at the WAN bottleneck seen by the link's sender (least srtt - min_rtt over a round trip).")
	m.lifts = d("mpi5k_wan_clamp_lifts_total", "Times queue control lifted the cap because another flow kept the bottleneck queue full.")
	m.cwnd = d("mpi5k_wan_tcp_cwnd_segments", "TCP_INFO congestion window of the WAN socket.")
	m.ssthresh = d("mpi5k_wan_tcp_ssthresh_segments", "TCP_INFO slow-start threshold of the WAN socket (absent while still in the first slow start).")
	m.srtt = d("mpi5k_wan_tcp_rtt_seconds", "TCP_INFO smoothed RTT of the WAN socket.")
	m.retrans = d("mpi5k_wan_tcp_retransmits_total", "TCP_INFO total retransmitted segments.")
	m.lost = d("mpi5k_wan_tcp_lost_segments", "TCP_INFO segments currently considered lost.")
	m.notsent = d("mpi5k_wan_tcp_notsent_bytes", "TCP_INFO bytes queued in the socket not yet sent.")
	m.samples = d("mpi5k_wan_tcp_samples_total", "TCP_INFO samples taken of the WAN socket for event derivation.")
	m.rtxFast = d("mpi5k_wan_tcp_retransmits_fast_total", "Segments retransmitted by fast retransmit/recovery (no timeout).")
	m.rtxRTO = d("mpi5k_wan_tcp_retransmits_rto_total", "Segments retransmitted in RTO recovery.")
	m.rtos = d("mpi5k_wan_tcp_rtos_total", "Retransmission timeouts of the WAN socket.")
	m.idleRst = d("mpi5k_wan_tcp_idle_restarts_total", "Congestion window restarts after idle (slow start after idle).")
	m.probeRTTs = d("mpi5k_wan_bbr_probe_rtt_total", "BBR PROBE_RTT dips of the WAN socket (cwnd held at 4 segments for >= 200 ms after 10 s without a lower RTT sample).")
	m.probeRTTTime = d("mpi5k_wan_bbr_probe_rtt_seconds_total", "Time the WAN socket spent in BBR PROBE_RTT (to within the 100 ms sampling period).")
	m.bbrBW = d("mpi5k_wan_bbr_bandwidth_bytes_per_second", "BBR's estimate of the WAN socket's bottleneck bandwidth (TCP_CC_INFO).")
	m.holds = d("mpi5k_wan_bbr_holds_total", "Times the PROBE_RTT guard idled the busy BBR bulk link across its min_rtt filter's expiry.")
	m.skips = d("mpi5k_wan_bbr_probe_rtt_skips_total", "Holds after which BBR restamped min_rtt from the restart instead of entering PROBE_RTT.")
	m.held = d("mpi5k_wan_bbr_hold_seconds_total", "Time the PROBE_RTT guard held the link's writes (draining included).")
	m.bbrMinRTT = d("mpi5k_wan_bbr_min_rtt_seconds", "BBR's windowed minimum RTT of the WAN socket (TCP_CC_INFO).")
	m.reg.MustRegister(m)
	m.sited.MustRegister(m.lanRefused, m.wanRefused, m.wanDialFailures, m.streamsOpened, m.peerQueries,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.bytes, m.pad, m.frames, m.polled, m.partial, m.inline, m.writes, m.stalls, m.streams, m.up, m.rtt, m.rtts,
		m.clamp, m.peerClamp, m.queue, m.lifts,
		m.cwnd, m.ssthresh, m.srtt, m.retrans, m.lost, m.notsent, m.samples, m.rtxFast, m.rtxRTO, m.rtos, m.idleRst, m.renewals, m.yields, m.peerStreams, m.early,
		m.probeRTTs, m.probeRTTTime, m.bbrBW, m.bbrMinRTT, m.holds, m.skips, m.held, m.down, m.resumes, m.replayed, m.replay} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		peer, idx string
		l         *relay.Link
		past      linkCounts // the slot's earlier links
	}
	var rows []row
	var renewed []prometheus.Metric
	m.g.peersMu.Lock()
	for _, p := range m.g.peers {
		if p.lay.Load().express {
			renewed = append(renewed, prometheus.MustNewConstMetric(m.renewals, prometheus.CounterValue, float64(p.renewed.Load()), p.name),
				prometheus.MustNewConstMetric(m.yields, prometheus.CounterValue, float64(p.yields.Load()), p.name))
		}
		renewed = append(renewed, prometheus.MustNewConstMetric(m.peerStreams, prometheus.GaugeValue, float64(p.streamsIn.Load()), p.name),
			prometheus.MustNewConstMetric(m.early, prometheus.GaugeValue, float64(p.trunk.EarlyBytes()), p.name))
		n := p.lay.Load().numLinks()
		for i, l := range p.links {
			if past := p.pastCounts(i); i < n || l != nil || past != (linkCounts{}) {
				rows = append(rows, row{p.name, strconv.Itoa(i), l, past})
			}
		}
	}
	m.g.peersMu.Unlock()
	for _, x := range renewed {
		ch <- x
	}
	for _, r := range rows {
		c := func(d *prometheus.Desc, t prometheus.ValueType, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{r.peer, r.idx}, extra...)...)
		}
		n := r.past
		if r.l != nil {
			n.add(r.l)
		}
		c(m.bytes, prometheus.CounterValue, float64(n.bytesTx), "tx")
		c(m.bytes, prometheus.CounterValue, float64(n.bytesRx), "rx")
		c(m.pad, prometheus.CounterValue, float64(n.padTx), "tx")
		c(m.pad, prometheus.CounterValue, float64(n.padRx), "rx")
		c(m.frames, prometheus.CounterValue, float64(n.framesTx), "tx")
		c(m.frames, prometheus.CounterValue, float64(n.framesRx), "rx")
		if r.l == nil {
			c(m.up, prometheus.GaugeValue, 0)
			continue
		}
		st := &r.l.Stats
		if rs := r.l.ResumeStats(); rs.Enable {
			c(m.down, prometheus.GaugeValue, rs.DownFor.Seconds())
			c(m.resumes, prometheus.CounterValue, float64(rs.Resumes))
			c(m.replayed, prometheus.CounterValue, float64(rs.Replayed))
			c(m.replay, prometheus.GaugeValue, float64(rs.ReplayBytes))
			if rs.Down {
				c(m.up, prometheus.GaugeValue, 0)
				continue
			}
		}
		c(m.up, prometheus.GaugeValue, 1)
		c(m.polled, prometheus.CounterValue, float64(st.PollSent.Load()), "tx")
		c(m.polled, prometheus.CounterValue, float64(st.PollRecv.Load()), "rx")
		c(m.partial, prometheus.CounterValue, float64(st.PollPartial.Load()))
		c(m.inline, prometheus.CounterValue, float64(st.InlineSent.Load()))
		c(m.writes, prometheus.CounterValue, float64(st.Writes.Load()))
		c(m.stalls, prometheus.CounterValue, float64(st.WindowStalls.Load()))
		c(m.streams, prometheus.GaugeValue, float64(r.l.NumStreams()))
		c(m.rtt, prometheus.GaugeValue, float64(st.RTT.Load())/1e9)
		if n, sum, cum := st.RTTs.Snapshot(); n > 0 {
			buckets := make(map[float64]uint64, len(cum))
			for i, b := range relay.RTTBuckets {
				buckets[b.Seconds()] = cum[i]
			}
			ch <- prometheus.MustNewConstHistogram(m.rtts, n, sum.Seconds(), buckets, r.peer, r.idx)
		}
		c(m.clamp, prometheus.GaugeValue, float64(st.Clamp.Load()))
		c(m.peerClamp, prometheus.GaugeValue, float64(st.PeerClamp.Load()))
		c(m.queue, prometheus.GaugeValue, float64(st.QueueDelay.Load())/1e9)
		c(m.lifts, prometheus.CounterValue, float64(st.ClampLifts.Load()))
		if ti, err := tuning.TCPInfo(r.l.Conn()); err == nil {
			c(m.cwnd, prometheus.GaugeValue, float64(ti.Snd_cwnd))
			if ti.Snd_ssthresh < tcpinfo.InfiniteSsthresh {
				c(m.ssthresh, prometheus.GaugeValue, float64(ti.Snd_ssthresh))
			}
			c(m.srtt, prometheus.GaugeValue, float64(ti.Rtt)/1e6)
			c(m.retrans, prometheus.CounterValue, float64(ti.Total_retrans))
			c(m.lost, prometheus.GaugeValue, float64(ti.Lost))
			c(m.notsent, prometheus.GaugeValue, float64(ti.Notsent_bytes))
		}
		if k, b, ok, bbr := m.ev.counters(r.l); ok {
			c(m.samples, prometheus.CounterValue, float64(k.Samples))
			c(m.rtxFast, prometheus.CounterValue, float64(k.RetransFast))
			c(m.rtxRTO, prometheus.CounterValue, float64(k.RetransRTO))
			c(m.rtos, prometheus.CounterValue, float64(k.RTOs))
			c(m.idleRst, prometheus.CounterValue, float64(k.IdleRestarts))
			if bbr {
				c(m.probeRTTs, prometheus.CounterValue, float64(k.ProbeRTTs))
				c(m.probeRTTTime, prometheus.CounterValue, k.ProbeRTTTime.Seconds())
				c(m.bbrBW, prometheus.GaugeValue, float64(b.Bandwidth))
				c(m.bbrMinRTT, prometheus.GaugeValue, b.MinRTT.Seconds())
			}
		}
		if holds, skips, held, ok := m.g.guard.Counters(r.l); ok {
			c(m.holds, prometheus.CounterValue, float64(holds))
			c(m.skips, prometheus.CounterValue, float64(skips))
			c(m.held, prometheus.CounterValue, held.Seconds())
		}
	}
}

func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		// ?tag=: the asker started a gateway with this ReadyTag and must
		// not take another job's gateway on the same port for its own.
		if tag := r.URL.Query().Get("tag"); tag != "" && tag != m.g.cfg.ReadyTag {
			http.Error(w, "this gateway was started for another job (--ready-tag differs)", http.StatusConflict)
			return
		}
		// ?sites=a,b: a service gateway serves jobs of some sites while
		// others may be down; a job asks for the links it needs.
		if q := r.URL.Query().Get("sites"); q != "" {
			if err := m.g.upFor(strings.Split(q, ",")); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
			return
		}
		// ?primed=0: the links are up, and priming may still run (a job
		// may start; its first bytes join the filler on the bulk links).
		if r.URL.Query().Get("primed") == "0" {
			if err := m.g.linksUp(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
			return
		}
		if m.g.allUp() {
			fmt.Fprintln(w, "ready")
			for _, d := range m.g.Degraded() {
				fmt.Fprintf(w, "degraded (%s): %s\n", d, degraded.Text(d))
			}
			return
		}
		http.Error(w, "not ready: a WAN link is down or being primed", http.StatusServiceUnavailable)
	})
	return mux
}

// The /metrics and /ready server holds at most maxMetricsConns
// connections: the descriptors are the ones the LAN and WAN budgets
// count on (limits.go), and a scraper needs one or two. Further
// connections wait in the kernel's accept queue, where they hold none. A
// connection that sends no request header within metricsHeaderTime, or
// stays idle between requests for metricsIdleTime, is closed.
const (
	maxMetricsConns   = 32
	metricsHeaderTime = 5 * time.Second
	metricsIdleTime   = 30 * time.Second
)

func metricsServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h,
		ReadHeaderTimeout: metricsHeaderTime, ReadTimeout: 2 * metricsHeaderTime, WriteTimeout: metricsIdleTime,
		IdleTimeout: metricsIdleTime, MaxHeaderBytes: 16 << 10}
}

// limitListener accepts at most cap(sem) connections at once, as
// golang.org/x/net/netutil.LimitListener does.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: sync.OnceFunc(func() { <-l.sem })}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
