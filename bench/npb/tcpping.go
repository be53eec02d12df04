package npb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"time"
)

// The plain relay chain baseline: a raw TCP ping-pong (no MPI) whose path
// goes through socat on each site's gateway host. It prints the same
// MPI5K-PINGPONG lines as the MPI ping-pong, so the curves share a figure.
// Frames are a 4-byte big-endian length then the payload; the server echoes
// each frame back unchanged.

// maxFrame bounds what the echo server accepts.
const maxFrame = 64 << 20

// ServeEcho echoes frames on every connection of ln until ln is closed.
func ServeEcho(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			_ = echo(c)
		}()
	}
}

func echo(c net.Conn) error {
	var hdr [4]byte
	buf := make([]byte, 0, 1<<20)
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			return fmt.Errorf("frame of %d bytes exceeds %d", n, maxFrame)
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if _, err := (&net.Buffers{hdr[:], buf}).WriteTo(c); err != nil {
			return err
		}
	}
}

// TCPPingOptions are the sizes and repetitions, as for the MPI ping-pong.
type TCPPingOptions struct {
	MinSize, MaxSize, Step int
	Reps, Warmup           int
}

// TCPPing measures half-round-trip latency per size over c and verifies
// every echo against what was sent.
func TCPPing(c net.Conn, o TCPPingOptions) ([]PingPoint, error) {
	if o.MinSize < 1 || o.MaxSize < o.MinSize || o.Step < 2 || o.Reps < 1 || o.MaxSize > maxFrame {
		return nil, fmt.Errorf("bad ping-pong options %+v", o)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	var pts []PingPoint
	rng := rand.New(rand.NewPCG(1, 2))
	for size := o.MinSize; size <= o.MaxSize; size *= o.Step {
		reps := o.Reps
		if size > 64<<10 {
			reps = max(5, min(o.Reps, o.Reps*(64<<10)/size))
		}
		out := make([]byte, 4+size)
		in := make([]byte, 4+size)
		binary.BigEndian.PutUint32(out, uint32(size))
		lat := make([]float64, 0, reps)
		for r := -o.Warmup; r < reps; r++ {
			for i := 4; i < len(out); i += 8 {
				var w [8]byte
				binary.LittleEndian.PutUint64(w[:], rng.Uint64())
				copy(out[i:], w[:])
			}
			t0 := time.Now()
			if _, err := c.Write(out); err != nil {
				return pts, err
			}
			if _, err := io.ReadFull(c, in); err != nil {
				return pts, err
			}
			dt := time.Since(t0)
			if !bytes.Equal(in, out) {
				return pts, fmt.Errorf("VERIFICATION FAILED workload=pingpong size=%d rep=%d: echo differs from what was sent", size, r)
			}
			if r >= 0 {
				lat = append(lat, dt.Seconds()/2*1e6)
			}
		}
		sort.Float64s(lat)
		med := Median(append([]float64(nil), lat...))
		pts = append(pts, PingPoint{Size: size, Reps: reps, LatMinUs: lat[0], LatMedUs: med, BWMBps: float64(size) / med})
	}
	return pts, nil
}

// WriteTCPPing prints the points and a result line like mpi5k-workload's
// (mpi=tcp), so the runner reads a relay-chain run like any other.
func WriteTCPPing(w io.Writer, pts []PingPoint, elapsed time.Duration) {
	var bytes, msgs uint64
	for _, p := range pts {
		fmt.Fprintf(w, "MPI5K-PINGPONG size=%d reps=%d lat_us_min=%.3f lat_us_med=%.3f bw_MBps=%.3f\n",
			p.Size, p.Reps, p.LatMinUs, p.LatMedUs, p.BWMBps)
		bytes += uint64(p.Size) * uint64(2*p.Reps)
		msgs += uint64(2 * p.Reps)
	}
	fmt.Fprintf(w, "MPI5K-RESULT workload=pingpong mpi=tcp ranks=2 sites=2 time_s=%.6f compute_s=0 bytes=%d msgs=%d "+
		"wan_bytes=%d wan_msgs=%d failures=0 loops_per_us=0 verified=yes\n", elapsed.Seconds(), bytes, msgs, bytes, msgs)
}
