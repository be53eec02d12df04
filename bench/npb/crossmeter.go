package npb

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"
)

// crossTag starts the line a lab run's output gets when competing flows
// ran beside it: what they sent while the job ran ("MPI5K-CROSS bytes=N
// seconds=F"), so a comparison shows the WAN share each mode left them.
const crossTag = "MPI5K-CROSS"

// crossMeter samples a byte counter of the competing flows while a job
// runs, so that their bytes can be read over the job's own time (its
// result's time_s, ending when the result line appeared) rather than
// over the whole command, whose start and teardown (gateways starting
// and stopping) leave the WAN to them.
type crossMeter struct {
	read func() (uint64, error)
	done chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	at  []time.Time
	n   []uint64
	err error
}

// crossPeriod is how often a crossMeter reads its counter: a small
// part of the shortest job's time.
const crossPeriod = 200 * time.Millisecond

func startCrossMeter(read func() (uint64, error)) *crossMeter {
	m := &crossMeter{read: read, done: make(chan struct{})}
	m.sample()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(crossPeriod)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				m.sample()
			}
		}
	}()
	return m
}

func (m *crossMeter) sample() {
	n, err := m.read()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.err == nil {
			m.err = err
		}
		return
	}
	m.at, m.n = append(m.at, now), append(m.n, n)
}

// stop ends the sampling and returns the MPI5K-CROSS line for a job
// whose result line clock saw, or a line saying why there is none.
func (m *crossMeter) stop(clock *resultClock) []byte {
	m.sample()
	close(m.done)
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return []byte(fmt.Sprintf("# %s: no reading of the competing flows: %v\n", crossTag, m.err))
	}
	end, secs := clock.result()
	if end.IsZero() || secs <= 0 {
		return nil // the run has no time to read them over; judge says why
	}
	start := end.Add(-time.Duration(secs * float64(time.Second)))
	b0, ok0 := interpolate(m.at, m.n, start)
	b1, ok1 := interpolate(m.at, m.n, end)
	if !ok0 || !ok1 {
		return []byte(fmt.Sprintf("# %s: the job's %.3f s are not inside the %d readings of the competing flows\n",
			crossTag, secs, len(m.at)))
	}
	return []byte(fmt.Sprintf("%s bytes=%d seconds=%.3f\n", crossTag, uint64(b1-b0), end.Sub(start).Seconds()))
}

// interpolate reads the counter n, sampled at times at, at time t
// (linearly between the samples around it); ok is false outside them.
func interpolate(at []time.Time, n []uint64, t time.Time) (float64, bool) {
	for i := 1; i < len(at); i++ {
		if t.Before(at[i-1]) {
			return 0, false
		}
		if !t.After(at[i]) {
			span := at[i].Sub(at[i-1]).Seconds()
			if span <= 0 {
				return float64(n[i]), true
			}
			f := t.Sub(at[i-1]).Seconds() / span
			return float64(n[i-1]) + f*(float64(n[i])-float64(n[i-1])), true
		}
	}
	return 0, false
}

// resultClock passes a job's output lines on to w (when not nil) and
// notes when the result line went by, the end of the job's own time, and
// the time_s it reports.
type resultClock struct {
	w     io.Writer
	mu    sync.Mutex
	at    time.Time
	timeS float64
}

// result is when the result line went by (zero: it did not) and its
// time_s (0 when it did not parse: judge says why).
func (r *resultClock) result() (time.Time, float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at, r.timeS
}

func (r *resultClock) Write(p []byte) (int, error) {
	if line := bytes.TrimSpace(p); bytes.HasPrefix(line, []byte(resultTag+" ")) {
		r.mu.Lock()
		if r.at.IsZero() {
			r.at = time.Now()
			if res, err := ParseResult(string(line[len(resultTag)+1:])); err == nil {
				r.timeS = res.TimeS
			}
		}
		r.mu.Unlock()
	}
	if r.w == nil {
		return len(p), nil
	}
	return r.w.Write(p)
}
