package shimtest

import (
	"io"
	"testing"

	"github.com/mpi5k/mpi5k/trace"
)

// traceSamples returns the fd and the TCP_INFO samples of a traced "conn"
// client run (traceConn).
func traceSamples(t *testing.T, env ...string) (int32, []trace.Record) {
	t.Helper()
	r, _ := traceConn(t, env...)
	fd := int32(-1)
	var samples []trace.Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Kind {
		case trace.KindConn:
			fd = rec.FD
		case trace.KindSample:
			samples = append(samples, rec)
		}
	}
	return fd, samples
}

// TestTraceSamples: a traced TCP connection is sampled right after connect
// and right before close, on its own fd, with a plausible TCP_INFO.
func TestTraceSamples(t *testing.T) {
	fd, samples := traceSamples(t)
	var open, closing int
	for _, s := range samples {
		if s.FD != fd {
			t.Errorf("sample of fd %d, the connection is fd %d", s.FD, fd)
		}
		if s.TCP.MSS == 0 || s.TCP.Cwnd == 0 {
			t.Errorf("sample without MSS or cwnd: %+v", s.TCP)
		}
		switch s.TCP.When {
		case trace.SampleOpen:
			open++
		case trace.SampleClose:
			closing++
			if s.TCP.RTT <= 0 {
				t.Errorf("close sample without an RTT after a 100-byte exchange: %+v", s.TCP)
			}
		}
	}
	if open != 1 || closing != 1 {
		t.Errorf("%d open and %d close samples, want 1 and 1 (samples %+v)", open, closing, samples)
	}
}

// TestTraceSamplesOff: MPI5K_TRACE_SAMPLE=off records no samples (calls
// are still traced); a bad value is refused with a message, not a crash.
func TestTraceSamplesOff(t *testing.T) {
	if _, samples := traceSamples(t, "MPI5K_TRACE_SAMPLE=off"); len(samples) != 0 {
		t.Errorf("%d samples with sampling off", len(samples))
	}
	if _, samples := traceSamples(t, "MPI5K_TRACE_SAMPLE=fast"); len(samples) != 0 {
		t.Errorf("%d samples with a bad MPI5K_TRACE_SAMPLE", len(samples))
	}
}
