package testbed

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// shaper is one direction's serialization and drop-tail queue. Departures are
// monotonic and the delay is constant per packet, so a plain FIFO of
// (deliver time, packet) is enough downstream: no timer wheel, no sorting.
type shaper struct {
	rate    uint64 // bit/s, 0 = unlimited
	queue   int    // bytes the queue may hold (waiting, not yet serialized)
	lastDep int64  // ns: when the link finishes serializing the last accepted packet
}

// admit decides for a packet of n bytes arriving at now (ns). It returns the
// time its last bit leaves the link, how long it waits behind earlier
// packets, and false when the queue is full (drop-tail).
func (s *shaper) admit(now int64, n int) (dep, wait int64, ok bool) {
	if s.rate == 0 {
		return now, 0, true
	}
	start := s.lastDep
	if start < now {
		start = now
	}
	wait = start - now
	// Bytes still queued ahead of this packet at the link's rate.
	backlog := int64(float64(wait) * float64(s.rate) / 8e9)
	if backlog+int64(n) > int64(s.queue) {
		return 0, 0, false
	}
	dep = start + txTime(n, s.rate)
	s.lastDep = dep
	return dep, wait, true
}

// txTime is the serialization time of n bytes at rate bit/s, in ns.
func txTime(n int, rate uint64) int64 {
	if rate == 0 {
		return 0
	}
	return int64(uint64(n) * 8 * 1e9 / rate)
}

// deliverer turns departures into delivery times: constant delay plus
// uniform jitter in [-jitter, +jitter], clamped so packets never overtake
// each other (a FIFO link does not reorder) and never arrive before they
// left.
type deliverer struct {
	last int64
	rng  uint64 // xorshift state, never 0
}

func (d *deliverer) at(dep, delay, jitter int64) int64 {
	t := dep + delay
	if jitter > 0 {
		// xorshift64*: cheap, allocation-free, good enough for jitter.
		d.rng ^= d.rng >> 12
		d.rng ^= d.rng << 25
		d.rng ^= d.rng >> 27
		r := d.rng * 2685821657736338717
		t += int64(r%uint64(2*jitter+1)) - jitter
	}
	if t < dep {
		t = dep
	}
	if t < d.last {
		t = d.last
	}
	d.last = t
	return t
}

// reorderer gives the packets a link holds back (Config.Reorder) their
// delivery time: extra beyond the time they were due, so packets sent after
// them within extra arrive first. Held-back packets keep their order among
// themselves (clamped like deliverer's), so their lane stays a plain FIFO
// even when extra shrinks on the fly.
type reorderer struct {
	last int64
}

func (r *reorderer) hold(deliver, extra int64) int64 {
	t := max(deliver+extra, r.last)
	r.last = t
	return t
}

// histogram is a lock-free log-linear histogram of durations in µs: exact
// below 32 µs, then 16 buckets per power of two (<= 6.25 % error).
type histogram struct {
	b [histBuckets]atomic.Uint64
}

const histBuckets = 32 + 40*16

func histIndex(us uint64) int {
	if us < 32 {
		return int(us)
	}
	e := bits.Len64(us) - 5 // us>>e in [16,31]
	i := 32 + (e-1)*16 + int(us>>uint(e)) - 16
	if i >= histBuckets {
		i = histBuckets - 1
	}
	return i
}

// histUpper is the largest value (µs) that lands in bucket i.
func histUpper(i int) uint64 {
	if i < 32 {
		return uint64(i)
	}
	e := (i-32)/16 + 1
	m := uint64((i-32)%16 + 16)
	return (m+1)<<uint(e) - 1
}

func (h *histogram) add(d time.Duration) {
	us := int64(d / time.Microsecond)
	if us < 0 {
		us = 0
	}
	h.b[histIndex(uint64(us))].Add(1)
}

// Percentiles summarizes a distribution of durations.
type Percentiles struct {
	Count uint64        `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

// over counts the recorded durations of at least d (to the bucket: a
// bucket counts when its smallest value is >= d).
func (h *histogram) over(d time.Duration) uint64 {
	us := uint64(d / time.Microsecond)
	var n uint64
	for i := range h.b {
		lower := uint64(0)
		if i > 0 {
			lower = histUpper(i-1) + 1
		}
		if lower >= us {
			n += h.b[i].Load()
		}
	}
	return n
}

func (h *histogram) percentiles() Percentiles {
	var counts [histBuckets]uint64
	var total uint64
	for i := range h.b {
		counts[i] = h.b[i].Load()
		total += counts[i]
	}
	p := Percentiles{Count: total}
	if total == 0 {
		return p
	}
	q := func(f float64) time.Duration {
		want := uint64(f*float64(total) + 0.5)
		if want < 1 {
			want = 1
		}
		var cum uint64
		for i, c := range counts {
			cum += c
			if cum >= want {
				return time.Duration(histUpper(i)) * time.Microsecond
			}
		}
		return 0
	}
	p.P50, p.P90, p.P99 = q(0.50), q(0.90), q(0.99)
	for i := histBuckets - 1; i >= 0; i-- {
		if counts[i] > 0 {
			p.Max = time.Duration(histUpper(i)) * time.Microsecond
			break
		}
	}
	return p
}

// seqAfter reports whether TCP sequence a is after b (mod 2^32).
func seqAfter(a, b uint32) bool { return int32(a-b) > 0 }

// flowState is what one direction of a flow has shown on the wire.
type flowState struct {
	packets, bytes, queueDrops, randomDrops, retrans uint64
	maxEnd                                           uint32 // highest sequence end seen
	haveSeq                                          bool
}

// observeTCP records a TCP segment and reports whether it repeats sequence
// space already seen (a retransmission, full or partial).
func (f *flowState) observeTCP(seq uint32, payload int, syn, fin bool) bool {
	n := uint32(payload)
	if syn {
		n++
	}
	if fin {
		n++
	}
	if n == 0 {
		return false // pure ACKs carry no sequence space
	}
	end := seq + n
	if !f.haveSeq {
		f.haveSeq, f.maxEnd = true, end
		return false
	}
	retrans := !seqAfter(seq, f.maxEnd) && seq != f.maxEnd
	if seqAfter(end, f.maxEnd) {
		f.maxEnd = end
	}
	if retrans {
		f.retrans++
	}
	return retrans
}
