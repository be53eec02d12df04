package mx

import (
	"context"
	"hash/crc32"
	"strings"
	"testing"
)

// TestStreamRecvAheadNoCopy: streams that keep two receives posted (and
// one, as by default) carry both directions whole under loss, duplication
// and reordering, one side writing its own buffers with WriteNoCopy (two
// in flight, each reused only once its requests are done, as the
// gateway's two-buffer forwarding does); after both ends close, no
// receive stays posted.
func TestStreamRecvAheadNoCopy(t *testing.T) {
	for _, c := range []struct {
		name  string
		loss  float64
		ahead int
	}{{"clean", 0, 2}, {"loss1", 0.01, 2}, {"loss10", 0.10, 2}, {"loss1-ahead1", 0.01, 1}} {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, a, b := pair(t, RandomFault(13, c.loss, 0.01, 0.05), Config{})
			d, s := streamPair(t, a, b, StreamConfig{RecvAhead: c.ahead})
			const n = 3<<20 + 17
			ctx := ctx10(t)
			streamBothWays(t, d, s, n, func() (uint32, error) { return pumpNoCopy(ctx, d, n, 3) }, func() (uint32, error) { return pump(s, n, 4) })
			d.Close()
			s.Close()
			<-d.recvDone
			<-s.recvDone
			nonePosted(t, "after both ends closed", a, b)
		})
	}
}

// pumpNoCopy sends n pseudo-random bytes from two buffers of uneven sizes
// with WriteNoCopy, refilling a buffer only once its sends are done, then
// half-closes; it returns their checksum.
func pumpNoCopy(ctx context.Context, w *Stream, n int, seed uint64) (uint32, error) {
	data := payload(seed, n)
	sizes := []int{1, 100, 1500, 9000, 70000, 300000}
	var bufs [2][]byte
	var reqs [2][]*Request
	wait := func(i int) error {
		for _, r := range reqs[i] {
			if _, err := r.Wait(ctx); err != nil {
				return err
			}
		}
		reqs[i] = reqs[i][:0]
		return nil
	}
	for off, k := 0, 0; off < n; k++ {
		i := k % 2
		if err := wait(i); err != nil {
			return 0, err
		}
		m := min(n-off, sizes[k%len(sizes)])
		bufs[i] = append(bufs[i][:0], data[off:off+m]...)
		var err error
		if reqs[i], err = w.WriteNoCopy(bufs[i], reqs[i]); err != nil {
			return 0, err
		}
		// Scribbling on the other buffer now would corrupt the stream
		// if WriteNoCopy had not waited: the checksum catches it.
		off += m
	}
	for i := range bufs {
		if err := wait(i); err != nil {
			return 0, err
		}
	}
	return crc32.ChecksumIEEE(data), w.CloseWrite()
}

// TestStreamRecvAheadRange: RecvAhead out of range is refused with its bound.
func TestStreamRecvAheadRange(t *testing.T) {
	_, _, _, a, _ := pair(t, nil, Config{})
	for _, k := range []int{-1, maxRecvAhead + 1} {
		if _, err := Listen(a, StreamConfig{RecvAhead: k}); err == nil || !strings.Contains(err.Error(), "out of range 1..4") {
			t.Errorf("RecvAhead %d: %v", k, err)
		}
	}
}
