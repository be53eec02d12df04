package relay

import (
	"sync/atomic"
	"time"
)

// RTTBuckets are the upper bounds of an RTTHistogram's buckets: 0.5 ms
// (two gateways on one LAN) to 5 s (a link waiting out losses).
var RTTBuckets = []time.Duration{
	500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
}

// RTTHistogram counts round trips by RTTBuckets without a lock: a PING's
// answer is recorded where it is read, and the exporter reads the counts
// at scrape time. A PING is a frame like any other, queued behind the
// link's data in both gateways' writers, so its round trip is what a
// message waits crossing the trunk and back.
type RTTHistogram struct {
	counts [14]atomic.Uint64 // per bucket, the last one above RTTBuckets' largest
	sum    atomic.Int64      // ns
}

// Observe records one round trip.
func (h *RTTHistogram) Observe(d time.Duration) {
	i := 0
	for i < len(RTTBuckets) && d > RTTBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Snapshot returns the number of round trips, their sum and, for each of
// RTTBuckets, how many were at most that long (cumulative, as Prometheus
// histograms count).
func (h *RTTHistogram) Snapshot() (count uint64, sum time.Duration, cumulative []uint64) {
	cumulative = make([]uint64, len(RTTBuckets))
	for i := range RTTBuckets {
		count += h.counts[i].Load()
		cumulative[i] = count
	}
	count += h.counts[len(RTTBuckets)].Load()
	return count, time.Duration(h.sum.Load()), cumulative
}
