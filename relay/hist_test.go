package relay

import (
	"slices"
	"testing"
	"time"
)

func TestRTTHistogram(t *testing.T) {
	var h RTTHistogram
	for _, d := range []time.Duration{100 * time.Microsecond, time.Millisecond, 21 * time.Millisecond, 21 * time.Millisecond, 9 * time.Second} {
		h.Observe(d)
	}
	n, sum, cum := h.Snapshot()
	if n != 5 || sum != 100*time.Microsecond+time.Millisecond+42*time.Millisecond+9*time.Second {
		t.Errorf("count %d sum %v", n, sum)
	}
	// ≤0.5ms ≤1ms ≤2ms ≤5ms ≤10ms ≤20ms ≤50ms ... ≤5s
	want := []uint64{1, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4}
	if !slices.Equal(cum, want) {
		t.Errorf("cumulative %v, want %v", cum, want)
	}
	if len(h.counts) != len(RTTBuckets)+1 {
		t.Errorf("%d counters for %d buckets", len(h.counts), len(RTTBuckets))
	}
}
