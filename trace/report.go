package trace

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Size histogram buckets (upper bounds, exclusive). The edges follow the
// NPB table of the design brief: tiny control messages (< 64 B, < 1 KiB),
// messages that fit in TCP's initial window of 10 segments (< 16 KiB),
// medium messages, the gateway's 128 KiB chunk neighbourhood, and bulk.
var BucketBounds = []int64{64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, math.MaxInt64}

// BucketLabels name BucketBounds.
var BucketLabels = []string{"<64B", "<1K", "<16K", "<64K", "<256K", "<1M", "<4M", ">=4M"}

// Stats describe the writes of a connection or an aggregate of them.
type Stats struct {
	// Conns counts TCP connections once even when both ends were traced
	// (same endpoint pair); Sockets counts each traced end.
	Conns    int   `json:"connections"`
	WANConns int   `json:"wan_connections"`
	Sockets  int   `json:"sockets"`
	Writes   int   `json:"writes"`
	Bytes    int64 `json:"bytes"`
	Min      int64 `json:"size_min"`
	Median   int64 `json:"size_median"`
	P90      int64 `json:"size_p90"`
	Max      int64 `json:"size_max"`
	Hist     []int `json:"size_histogram"` // counts per BucketLabels
	// MeanGap: mean time between consecutive writes of one connection
	// (span/(writes-1), pooled over the connections: Σspan / Σ(writes-1)),
	// the meaning of the design brief's "mean gap between writes".
	MeanGap float64 `json:"mean_gap_s"`
	// From TCP_INFO samples (connections with samples only).
	Sampled      int    `json:"sampled_connections"`
	Retrans      uint64 `json:"retransmits"`
	RetransFast  uint64 `json:"retransmits_fast"`
	RetransRTO   uint64 `json:"retransmits_rto"`
	RTOs         uint64 `json:"rtos"`
	IdleRestarts uint64 `json:"idle_restarts"`
	// Duration of the traced activity: first to last write (seconds).
	Span float64 `json:"span_s"`

	seen   map[string]bool
	sizes  []int64
	gapSum int64
	gapN   int64
	first  int64
	last   int64
}

func (s *Stats) addConn(c *Conn) {
	s.Sockets++
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	if k := c.key(); !s.seen[k] {
		s.seen[k] = true
		s.Conns++
		if c.Scope() == ScopeWAN {
			s.WANConns++
		}
	}
	for _, w := range c.Writes {
		s.sizes = append(s.sizes, w.Size)
		s.Bytes += w.Size
		if s.first == 0 || w.T < s.first {
			s.first = w.T
		}
		s.last = max(s.last, w.T)
	}
	if n := len(c.Writes); n > 1 {
		s.gapSum += c.Writes[n-1].T - c.Writes[0].T
		s.gapN += int64(n - 1)
	}
	if l, ok := c.Last(); ok {
		s.Sampled++
		s.Retrans += uint64(l.TotalRetrans)
		s.RetransFast += uint64(l.RetransFast)
		s.RetransRTO += uint64(l.RetransRTO)
		s.RTOs += uint64(l.RTOs)
		s.IdleRestarts += uint64(l.IdleRestarts)
	}
}

// key identifies the TCP connection behind c: both ends of a connection
// see the same two endpoints (for relayed ones, the true endpoints the shim
// and the gateway report).
func (c *Conn) key() string {
	if !c.Local.IsValid() || !c.Peer.IsValid() {
		return c.ID
	}
	a, b := c.Local.String(), c.Peer.String()
	if a > b {
		a, b = b, a
	}
	return a + "|" + b
}

// finish computes the distribution once every connection was added.
func (s *Stats) finish() {
	slices.Sort(s.sizes)
	s.Writes = len(s.sizes)
	s.seen = nil
	s.Hist = make([]int, len(BucketBounds))
	for _, v := range s.sizes {
		s.Hist[sort.Search(len(BucketBounds), func(i int) bool { return v < BucketBounds[i] })]++
	}
	if n := len(s.sizes); n > 0 {
		s.Min, s.Max = s.sizes[0], s.sizes[n-1]
		s.Median = s.sizes[quantileIndex(n, 0.5)]
		s.P90 = s.sizes[quantileIndex(n, 0.9)]
	}
	if s.gapN > 0 {
		s.MeanGap = float64(s.gapSum) / float64(s.gapN) / 1e9
	}
	if s.last > s.first {
		s.Span = float64(s.last-s.first) / 1e9
	}
}

// quantileIndex: nearest-rank quantile of n sorted values.
func quantileIndex(n int, q float64) int {
	i := int(math.Ceil(q*float64(n))) - 1
	return min(max(i, 0), n-1)
}

// fraction of writes with size < lo, and >= hi.
func (s *Stats) fractions(lo, hi int64) (below, above float64) {
	n := len(s.sizes)
	if n == 0 {
		return 0, 0
	}
	b := sort.Search(n, func(i int) bool { return s.sizes[i] >= lo })
	a := sort.Search(n, func(i int) bool { return s.sizes[i] >= hi })
	return float64(b) / float64(n), float64(n-a) / float64(n)
}

// ConnReport is one connection's line of the report.
type ConnReport struct {
	Conn  *Conn `json:"connection"`
	Scope Scope `json:"scope"`
	Stats Stats `json:"stats"`
}

// PairReport aggregates the connections from one host (site) to another.
type PairReport struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Scope Scope  `json:"scope"`
	Stats
}

// Class is the workload classification (docs/tracing.md, "Classification").
type Class struct {
	Scope     Scope  `json:"scope"`     // the writes classified: wan when there are any, else all
	Frequency string `json:"frequency"` // frequent, intermittent, rare, none
	Size      string `json:"size"`      // small, medium, large, mixed, none
	Sync      string `json:"sync"`      // synchronous, asynchronous, single-sender
	// Evidence behind the labels.
	MeanGap      float64 `json:"mean_gap_s"`
	Median       int64   `json:"size_median"`
	P90          int64   `json:"size_p90"`
	SmallFrac    float64 `json:"frac_below_1k"`
	LargeFrac    float64 `json:"frac_64k_or_more"`
	Bursts       int     `json:"bursts"`
	SyncBursts   int     `json:"sync_bursts"`
	Senders      int     `json:"senders"`
	BurstGap     float64 `json:"burst_gap_s"`
	SyncFraction float64 `json:"sync_fraction"`
}

// Classification thresholds; docs/tracing.md explains their origin.
const (
	// A connection idle for longer than the RTO (>= 200 ms in Linux)
	// restarts slow start; below it the window stays warm.
	FrequentGap = 200 * time.Millisecond
	// Gaps of a second and more (IS 1.24 s, FT 4.59 s in the NPB table):
	// every message meets a cold window.
	RareGap = time.Second
	// Messages below the initial window (10 segments, ~14.5 KiB) are
	// latency-bound; 64 KiB and more are bandwidth-bound.
	SmallSize = 16 << 10
	LargeSize = 64 << 10
	// Bimodal workloads (FT, IS: <400 B control + MiB data): at least
	// MixedFrac of the writes below 1 KiB and MixedFrac at or above 64 KiB.
	MixedFrac = 0.10
	// Writes closer than BurstGap belong to one burst; a burst is
	// synchronous when at least half of the sending processes (and >= 2)
	// wrote in it; the workload is when SyncShare of its bursts are.
	BurstGap  = 5 * time.Millisecond
	SyncShare = 0.5
)

// Report is everything `mpi5k trace report` prints.
type Report struct {
	Dir         string        `json:"dir"`
	Procs       []*Proc       `json:"processes"`
	Total       Stats         `json:"total"`
	WAN         Stats         `json:"wan"`
	Class       Class         `json:"classification"`
	SitePairs   []*PairReport `json:"site_pairs"`
	HostPairs   []*PairReport `json:"host_pairs"`
	Connections []*ConnReport `json:"connections"`
}

// NewReport aggregates t. Connections without a single data call in either
// direction are left out of the per-connection list (but counted).
func NewReport(t *Trace) *Report {
	r := &Report{Dir: t.Dir, Procs: t.Procs}
	sites := map[[2]string]*PairReport{}
	hosts := map[[2]string]*PairReport{}
	pair := func(m map[[2]string]*PairReport, from, to string, sc Scope) *PairReport {
		k := [2]string{from, to}
		p := m[k]
		if p == nil {
			p = &PairReport{From: from, To: to, Scope: sc}
			m[k] = p
		}
		return p
	}
	for _, c := range t.Conns {
		sc := c.Scope()
		r.Total.addConn(c)
		if sc == ScopeWAN {
			r.WAN.addConn(c)
		}
		peerHost := c.PeerHost
		if peerHost == "" {
			peerHost = UnknownSite
		}
		pair(hosts, c.Host, peerHost, sc).addConn(c)
		ssc := sc
		if sc == ScopeLocal {
			ssc = ScopeLAN
		}
		pair(sites, c.Site, c.PeerSite, ssc).addConn(c)
		if len(c.Writes) > 0 || c.Read > 0 || len(c.Samples) > 0 {
			cr := &ConnReport{Conn: c, Scope: sc}
			cr.Stats.addConn(c)
			cr.Stats.finish()
			r.Connections = append(r.Connections, cr)
		}
	}
	r.Total.finish()
	r.WAN.finish()
	r.SitePairs = sortedPairs(sites)
	r.HostPairs = sortedPairs(hosts)
	sort.SliceStable(r.Connections, func(i, j int) bool {
		a, b := r.Connections[i], r.Connections[j]
		if a.Stats.Bytes != b.Stats.Bytes {
			return a.Stats.Bytes > b.Stats.Bytes
		}
		return a.Conn.ID < b.Conn.ID
	})
	r.Class = classify(t, r)
	return r
}

func sortedPairs(m map[[2]string]*PairReport) []*PairReport {
	out := make([]*PairReport, 0, len(m))
	for _, p := range m {
		p.finish()
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		if out[i].From != out[j].From {
			return out[i].From < out[j].From
		}
		return out[i].To < out[j].To
	})
	return out
}

func classify(t *Trace, r *Report) Class {
	s, sc := &r.WAN, ScopeWAN
	if s.Writes == 0 {
		s, sc = &r.Total, Scope("all")
	}
	c := Class{Scope: sc, MeanGap: s.MeanGap, Median: s.Median, P90: s.P90, BurstGap: BurstGap.Seconds()}
	c.SmallFrac, c.LargeFrac = s.fractions(1<<10, LargeSize)
	if s.Writes == 0 {
		c.Frequency, c.Size, c.Sync = "none", "none", "none"
		return c
	}
	gap := time.Duration(s.MeanGap * 1e9)
	switch {
	case s.gapN == 0 || gap >= RareGap:
		c.Frequency = "rare"
	case gap < FrequentGap:
		c.Frequency = "frequent"
	default:
		c.Frequency = "intermittent"
	}
	switch {
	case c.SmallFrac >= MixedFrac && c.LargeFrac >= MixedFrac:
		c.Size = "mixed"
	case s.P90 < SmallSize:
		c.Size = "small"
	case s.Median >= LargeSize:
		c.Size = "large"
	default:
		c.Size = "medium"
	}
	// Bursts over the writes in scope of every process, by wall time.
	type ev struct {
		t    int64
		proc string
	}
	var evs []ev
	for _, cn := range t.Conns {
		if sc == ScopeWAN && cn.Scope() != ScopeWAN {
			continue
		}
		proc := fmt.Sprintf("%s.%d", cn.Host, cn.PID)
		for _, w := range cn.Writes {
			evs = append(evs, ev{w.T, proc})
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].t < evs[j].t })
	senders := map[string]bool{}
	for _, e := range evs {
		senders[e.proc] = true
	}
	c.Senders = len(senders)
	need := max(2, (c.Senders+1)/2)
	in := map[string]bool{}
	n := 0
	flush := func() {
		if n >= 2 {
			c.Bursts++
			if len(in) >= need {
				c.SyncBursts++
			}
		}
		clear(in)
		n = 0
	}
	for i, e := range evs {
		if i > 0 && e.t-evs[i-1].t > int64(BurstGap) {
			flush()
		}
		in[e.proc] = true
		n++
	}
	flush()
	if c.Bursts > 0 {
		c.SyncFraction = float64(c.SyncBursts) / float64(c.Bursts)
	}
	switch {
	case c.Senders < 2:
		c.Sync = "single-sender"
	case c.Bursts > 0 && c.SyncFraction >= SyncShare:
		c.Sync = "synchronous"
	default:
		c.Sync = "asynchronous"
	}
	return c
}

// FormatBytes prints n with a binary unit.
func FormatBytes(n int64) string {
	f := float64(n)
	for _, u := range []string{"B", "KiB", "MiB", "GiB"} {
		if f < 1024 || u == "GiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", n)
			}
			return fmt.Sprintf("%.1f %s", f, u)
		}
		f /= 1024
	}
	return ""
}

func fmtSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d", n)
	case n < 1<<20:
		return fmt.Sprintf("%.3gK", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.3gM", float64(n)/(1<<20))
}

func fmtGap(s *Stats) string {
	if s.gapN == 0 {
		return "-"
	}
	return (time.Duration(s.MeanGap * 1e9)).Round(10 * time.Microsecond).String()
}

func fmtTCP(s *Stats) (string, string, string) {
	if s.Sampled == 0 {
		return "n/a", "n/a", "n/a"
	}
	return fmt.Sprintf("%d (%d fast, %d rto)", s.Retrans, s.RetransFast, s.RetransRTO),
		fmt.Sprint(s.RTOs), fmt.Sprint(s.IdleRestarts)
}

// WriteText prints the report as tables.
func (r *Report) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	lost, trunc := uint64(0), 0
	hosts, sites := map[string]bool{}, map[string]bool{}
	for _, p := range r.Procs {
		lost += p.Lost
		if p.Truncated {
			trunc++
		}
		hosts[p.Host], sites[p.Site] = true, true
	}
	fmt.Fprintf(b, "trace %s: %d processes on %d hosts in %d sites", r.Dir, len(r.Procs), len(hosts), len(sites))
	if lost > 0 {
		fmt.Fprintf(b, ", %d records LOST (ring full)", lost)
	}
	if trunc > 0 {
		fmt.Fprintf(b, ", %d files truncated", trunc)
	}
	fmt.Fprintf(b, "\n")
	fmt.Fprintf(b, "all:  %d connections (%d traced sockets), %d writes, %s, span %.3fs\n", r.Total.Conns, r.Total.Sockets, r.Total.Writes, FormatBytes(r.Total.Bytes), r.Total.Span)
	fmt.Fprintf(b, "WAN:  %d connections (%d traced sockets), %d writes, %s, mean gap %s\n", r.WAN.Conns, r.WAN.Sockets, r.WAN.Writes, FormatBytes(r.WAN.Bytes), fmtGap(&r.WAN))
	retr, rtos, idle := fmtTCP(&r.WAN)
	fmt.Fprintf(b, "WAN TCP (%d of %d sockets sampled): retransmits %s, RTOs %s, idle restarts %s\n", r.WAN.Sampled, r.WAN.Sockets, retr, rtos, idle)
	c := &r.Class
	fmt.Fprintf(b, "workload (%s writes): %s, %s messages, %s", c.Scope, c.Frequency, c.Size, c.Sync)
	fmt.Fprintf(b, "  [mean gap %s, median %s B, p90 %s B, %.0f%% < 1 KiB, %.0f%% >= 64 KiB, %d/%d bursts with >= half of %d senders]\n",
		time.Duration(c.MeanGap*1e9).Round(10*time.Microsecond), fmtSize(c.Median), fmtSize(c.P90), 100*c.SmallFrac, 100*c.LargeFrac, c.SyncBursts, c.Bursts, c.Senders)

	fmt.Fprintf(b, "\nsize buckets: %s\n", strings.Join(BucketLabels, " "))
	pairs := func(title string, ps []*PairReport) {
		fmt.Fprintf(b, "\n%s\n", title)
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "from\tto\tscope\tconns\twrites\tbytes\tmin\tmedian\tp90\tmax\tmean gap\tretransmits\tRTOs\tidle restarts\thistogram\t\n")
		for _, p := range ps {
			retr, rtos, idle := fmtTCP(&p.Stats)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", p.From, p.To, p.Scope, p.Conns, p.Writes,
				FormatBytes(p.Bytes), fmtSize(p.Min), fmtSize(p.Median), fmtSize(p.P90), fmtSize(p.Max), fmtGap(&p.Stats), retr, rtos, idle, hist(p.Hist))
		}
		tw.Flush()
	}
	pairs("site pairs (writes from -> to)", r.SitePairs)
	pairs("host pairs (writes from -> to)", r.HostPairs)

	fmt.Fprintf(b, "\nconnections (by bytes written)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "id\tlocal\tpeer\tpeer host\tscope\tvia\twrites\tbytes\tread\tmedian\tp90\tmax\tmean gap\tretransmits\tRTOs\tidle restarts\t\n")
	for _, cr := range r.Connections {
		c, s := cr.Conn, &cr.Stats
		via := "direct"
		if c.Relayed {
			via = "gateway"
		}
		if c.Accepted {
			via += ",acc"
		}
		retr, rtos, idle := fmtTCP(s)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.ID, ap(c.Local), ap(c.Peer), c.PeerHost,
			cr.Scope, via, s.Writes, FormatBytes(s.Bytes), FormatBytes(c.Read), fmtSize(s.Median), fmtSize(s.P90), fmtSize(s.Max), fmtGap(s), retr, rtos, idle)
	}
	tw.Flush()
	_, err := io.WriteString(w, b.String())
	return err
}

func ap(a netip.AddrPort) string {
	if !a.IsValid() {
		return "?"
	}
	return a.String()
}

func hist(h []int) string {
	p := make([]string, len(h))
	for i, v := range h {
		p[i] = fmt.Sprint(v)
	}
	return strings.Join(p, "/")
}
