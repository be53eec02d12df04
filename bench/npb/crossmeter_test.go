package npb

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestInterpolate: a counter is read linearly between its samples and
// not outside them.
func TestInterpolate(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second)}
	n := []uint64{1000, 3000, 3000}
	for _, c := range []struct {
		at   time.Duration
		want float64
		ok   bool
	}{
		{0, 1000, true}, {250 * time.Millisecond, 1500, true}, {1500 * time.Millisecond, 3000, true},
		{2 * time.Second, 3000, true}, {-time.Millisecond, 0, false}, {2001 * time.Millisecond, 0, false},
	} {
		got, ok := interpolate(at, n, t0.Add(c.at))
		if ok != c.ok || got != c.want {
			t.Errorf("at %v: %v, %v; want %v, %v", c.at, got, ok, c.want, c.ok)
		}
	}
}

// TestCrossMeter: the competing flows' bytes are read over the job's own
// time, the time_s before its result line, not over the whole command;
// the line parses back into the sample; a counter that cannot be read
// gives a comment naming the error, and no figure.
func TestCrossMeter(t *testing.T) {
	start := time.Now() // the counter grows 1 MB per second of wall time
	read := func() (uint64, error) { return uint64(time.Since(start).Seconds() * 1e6), nil }
	m := startCrossMeter(read)
	time.Sleep(900 * time.Millisecond)
	out := []byte("MPI5K-RESULT workload=bt mpi=openmpi ranks=4 sites=2 time_s=0.500 compute_s=0.1 bytes=1 msgs=1 wan_bytes=1 wan_msgs=1 failures=0 loops_per_us=1 verified=yes\n")
	clock := &resultClock{}
	clock.Write(out)
	time.Sleep(300 * time.Millisecond) // teardown: not the job's
	line := m.stop(clock)
	o, err := ParseOutput(bytes.NewReader(append(out, line...)))
	if err != nil || o.Cross == nil {
		t.Fatalf("%q: %v, %+v", line, err, o.Cross)
	}
	if o.Cross.Seconds != 0.5 || o.Cross.Bytes < 450e3 || o.Cross.Bytes > 550e3 {
		t.Errorf("%q: want about 500 kB over 0.5 s", line)
	}
	if mbit := o.Cross.Mbit(); mbit < 7 || mbit > 9 {
		t.Errorf("%.2f Mbit/s, want about 8", mbit)
	}
	if s := judge(Cell{Workload: "bt", Mode: "direct", Cross: true}, append(out, line...), nil); s.Competing == nil || *s.Competing != *o.Cross {
		t.Errorf("the sample does not carry the reading: %+v", s.Competing)
	}

	bad := startCrossMeter(func() (uint64, error) { return 0, errors.New("no traffic host") })
	if l := string(bad.stop(clock)); !strings.HasPrefix(l, "# MPI5K-CROSS") || !strings.Contains(l, "no traffic host") {
		t.Errorf("unreadable counter: %q", l)
	}
	if o, err := ParseOutput(strings.NewReader("MPI5K-CROSS bytes=x seconds=1\n")); err == nil {
		t.Errorf("a garbled line parsed: %+v", o.Cross)
	}
}
