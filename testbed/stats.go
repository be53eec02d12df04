package testbed

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Stats are the WAN link counters of a lab, one entry per direction.
type Stats struct {
	Lab string `json:"lab"`
	// Seed is the seed of the emulator's random choices (Config.Seed).
	Seed  uint64      `json:"seed"`
	Links []LinkStats `json:"links"`
	// LANs counts the sites' LAN loss (--lan-loss), one entry per lossy site.
	LANs []LANStats `json:"lans,omitempty"`
}

// LinkStats counts one direction of the emulated WAN (site From to site To).
// Packets/Bytes entered the link; Delivered* left it; drops are split into
// drop-tail queue drops and random (--loss) drops.
type LinkStats struct {
	From             string        `json:"from"`
	To               string        `json:"to"`
	Rate             uint64        `json:"rate_bps"`
	Queue            int           `json:"queue_bytes"`
	OneWay           time.Duration `json:"oneway_ns"`
	Jitter           time.Duration `json:"jitter_ns"`
	Loss             float64       `json:"loss"`
	Reorder          float64       `json:"reorder"`
	ReorderDelay     time.Duration `json:"reorder_delay_ns"`
	Packets          uint64        `json:"packets"`
	Bytes            uint64        `json:"bytes"`
	DeliveredPackets uint64        `json:"delivered_packets"`
	DeliveredBytes   uint64        `json:"delivered_bytes"`
	QueueDrops       uint64        `json:"queue_drops"`
	RandomDrops      uint64        `json:"random_drops"`
	// Held counts packets held back ReorderDelay (--reorder): each arrives
	// after whatever the link carried in the meantime.
	Held uint64 `json:"held"`
	// Tampered counts TCP segments a bit of which the emulator flipped
	// since the last Lab.Tamper (the man in the middle).
	Tampered uint64 `json:"tampered,omitempty"`
	// QueueDelay is the time packets waited behind others before being
	// serialized; Late is how much later than scheduled they were written
	// out (the emulator's own error: grows when the CPU saturates).
	QueueDelay Percentiles `json:"queue_delay"`
	Late       Percentiles `json:"late"`
	// Stalled counts packets written out StallLate or more behind schedule:
	// the emulator was starved of CPU (see testbed/README.md, "Known
	// problems"), and whatever crossed the WAN meanwhile was not emulated.
	Stalled uint64      `json:"stalled"`
	Flows   []FlowStats `json:"flows"`
	// OtherFlows aggregates flows beyond the per-link flow table limit.
	OtherFlows *FlowStats `json:"other_flows,omitempty"`
}

// FlowStats is one direction of one flow (5-tuple) on a link.
type FlowStats struct {
	Proto       string `json:"proto"` // tcp, udp, icmp or a protocol number
	Src         string `json:"src"`   // ip:port (ip for portless protocols)
	Dst         string `json:"dst"`
	Packets     uint64 `json:"packets"`
	Bytes       uint64 `json:"bytes"`
	QueueDrops  uint64 `json:"queue_drops"`
	RandomDrops uint64 `json:"random_drops"`
	// Retrans counts TCP segments repeating sequence space already seen on
	// this link (retransmissions as seen on the wire).
	Retrans uint64 `json:"retrans"`
}

// StallLate is how late a packet must leave the emulator to count as
// Stalled: far beyond any queueing the emulation itself does.
const StallLate = time.Second

// Stalled is the number of packets on every link that left StallLate or more
// late.
func (s *Stats) Stalled() uint64 {
	var n uint64
	for _, l := range s.Links {
		n += l.Stalled
	}
	return n
}

// Link returns the stats of direction from->to, or nil.
func (s *Stats) Link(from, to string) *LinkStats {
	for i := range s.Links {
		if s.Links[i].From == from && s.Links[i].To == to {
			return &s.Links[i]
		}
	}
	return nil
}

// Flow returns a link's flow whose src and dst start with the given
// prefixes ("10.77.1.11:" or an exact ip:port), or nil.
func (ls *LinkStats) Flow(proto, srcPrefix, dstPrefix string) *FlowStats {
	for i := range ls.Flows {
		f := &ls.Flows[i]
		if f.Proto == proto && strings.HasPrefix(f.Src, srcPrefix) && strings.HasPrefix(f.Dst, dstPrefix) {
			return f
		}
	}
	return nil
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/1e6)
}

// WritePairs prints one line per site pair: the pair's emulated WAN and
// both directions' delivered bytes, drops and p99 lateness.
func (s *Stats) WritePairs(w io.Writer) {
	fmt.Fprintf(w, "%-12s %-12s %9s %9s %8s %12s %12s %7s %7s %9s\n",
		"site a", "site b", "one-way", "rate", "loss", "a->b bytes", "b->a bytes", "drops", "retrans", "late p99")
	done := map[[2]string]bool{}
	for _, ab := range s.Links {
		// Each pair once, in the emulator's order (the lab's site order).
		if done[[2]string{ab.To, ab.From}] {
			continue
		}
		done[[2]string{ab.From, ab.To}] = true
		ba := s.Link(ab.To, ab.From)
		if ba == nil {
			ba = &LinkStats{}
		}
		rate := "unlimited"
		if ab.Rate > 0 {
			rate = fmt.Sprintf("%gM", float64(ab.Rate)/1e6)
		}
		var retrans uint64
		for _, l := range []*LinkStats{&ab, ba} {
			for _, f := range l.Flows {
				retrans += f.Retrans
			}
		}
		fmt.Fprintf(w, "%-12s %-12s %9s %9s %7.3f%% %12d %12d %7d %7d %9s\n",
			ab.From, ab.To, fmtDur(ab.OneWay), rate, ab.Loss*100, ab.DeliveredBytes, ba.DeliveredBytes,
			ab.QueueDrops+ab.RandomDrops+ba.QueueDrops+ba.RandomDrops, retrans, fmtDur(max(ab.Late.P99, ba.Late.P99)))
	}
}

// WriteText prints stats for people: the per-pair table, then one block per
// direction, flows sorted by bytes.
func (s *Stats) WriteText(w io.Writer) {
	fmt.Fprintf(w, "lab %s  seed %d\n\n", s.Lab, s.Seed)
	s.WritePairs(w)
	for _, ln := range s.LANs {
		fmt.Fprintf(w, "\nLAN of %s  loss %.3f%%  frames %d  dropped %d", ln.Site, ln.Loss*100, ln.Frames, ln.Drops)
		if ln.Reorder > 0 {
			fmt.Fprintf(w, "  reorder %.3f%% held back %s: %d packets", ln.Reorder*100, fmtDur(ln.ReorderDelay), ln.Held)
		}
		fmt.Fprintln(w)
	}
	for _, l := range s.Links {
		rate := "unlimited"
		if l.Rate > 0 {
			rate = fmt.Sprintf("%.1f Mbit/s", float64(l.Rate)/1e6)
		}
		fmt.Fprintf(w, "\n%s -> %s  rate %s  one-way %s  jitter %s  loss %.3f%%  queue %d B\n",
			l.From, l.To, rate, fmtDur(l.OneWay), fmtDur(l.Jitter), l.Loss*100, l.Queue)
		fmt.Fprintf(w, "  packets %d  bytes %d  delivered %d/%d B  queue drops %d  random drops %d\n",
			l.Packets, l.Bytes, l.DeliveredPackets, l.DeliveredBytes, l.QueueDrops, l.RandomDrops)
		if l.Reorder > 0 || l.Held > 0 {
			fmt.Fprintf(w, "  reorder %.3f%% held back %s: %d packets\n", l.Reorder*100, fmtDur(l.ReorderDelay), l.Held)
		}
		if l.Tampered > 0 {
			fmt.Fprintf(w, "  tampered %d TCP segments (a bit flipped, checksum fixed)\n", l.Tampered)
		}
		fmt.Fprintf(w, "  queue delay p50 %s p90 %s p99 %s max %s\n",
			fmtDur(l.QueueDelay.P50), fmtDur(l.QueueDelay.P90), fmtDur(l.QueueDelay.P99), fmtDur(l.QueueDelay.Max))
		fmt.Fprintf(w, "  late        p50 %s p90 %s p99 %s max %s\n",
			fmtDur(l.Late.P50), fmtDur(l.Late.P90), fmtDur(l.Late.P99), fmtDur(l.Late.Max))
		if l.Stalled > 0 {
			fmt.Fprintf(w, "  STALLED     %d packets written %v or more late: the emulator was starved of CPU\n", l.Stalled, StallLate)
		}
		flows := append([]FlowStats(nil), l.Flows...)
		sort.Slice(flows, func(i, j int) bool { return flows[i].Bytes > flows[j].Bytes })
		if len(flows) > 0 {
			fmt.Fprintf(w, "  %-5s %-21s %-21s %10s %12s %8s %8s %8s\n", "proto", "src", "dst", "packets", "bytes", "qdrops", "rdrops", "retrans")
		}
		for _, f := range flows {
			fmt.Fprintf(w, "  %-5s %-21s %-21s %10d %12d %8d %8d %8d\n", f.Proto, f.Src, f.Dst, f.Packets, f.Bytes, f.QueueDrops, f.RandomDrops, f.Retrans)
		}
		if o := l.OtherFlows; o != nil {
			fmt.Fprintf(w, "  (other flows) %10d packets %12d bytes %8d retrans\n", o.Packets, o.Bytes, o.Retrans)
		}
	}
}
