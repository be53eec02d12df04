package mx

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"sync"
	"testing"
)

// streamPair dials a stream from a to b's listener and accepts it.
func streamPair(t *testing.T, a, b *Endpoint, cfg StreamConfig) (*Stream, *Stream) {
	t.Helper()
	ctx := ctx10(t)
	ln, err := Listen(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Dial(ctx, a, b.Addr(), []byte("who"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Meta) != "who" || s.Peer() != a.Addr() {
		t.Fatalf("accepted meta %q from %v", s.Meta, s.Peer())
	}
	return d, s
}

// pump writes n pseudo-random bytes in uneven writes, then half-closes;
// it returns their checksum.
func pump(w *Stream, n int, seed uint64) (uint32, error) {
	data := payload(seed, n)
	for off, i := 0, 0; off < n; i++ {
		k := min(n-off, []int{1, 100, 1500, 9000, 70000, 300000}[i%6])
		if _, err := w.Write(data[off : off+k]); err != nil {
			return 0, err
		}
		off += k
	}
	return crc32.ChecksumIEEE(data), w.CloseWrite()
}

func drain(r io.Reader) (uint32, int, error) {
	h := crc32.NewIEEE()
	buf := make([]byte, 7000) // smaller than a chunk: partial reads
	n, err := io.CopyBuffer(h, r, buf)
	return h.Sum32(), int(n), err
}

func TestStreamBothWaysUnderLoss(t *testing.T) {
	for _, c := range []struct {
		name string
		loss float64
	}{{"clean", 0}, {"loss1", 0.01}, {"loss10", 0.10}} {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, a, b := pair(t, RandomFault(11, c.loss, 0.01, 0.05), Config{})
			d, s := streamPair(t, a, b, StreamConfig{})
			const n = 3<<20 + 17
			streamBothWays(t, d, s, n, func() (uint32, error) { return pump(d, n, 1) }, func() (uint32, error) { return pump(s, n, 2) })
			d.Close()
			s.Close()
		})
	}
}

// streamBothWays sends n bytes each way at once, d's with sendD and s's with
// sendS (each returning its checksum), and checks that both arrive whole.
func streamBothWays(t *testing.T, d, s *Stream, n int, sendD, sendS func() (uint32, error)) {
	t.Helper()
	var wg sync.WaitGroup
	var sums [2]uint32
	var errs [2]error
	wg.Add(2)
	go func() { defer wg.Done(); sums[0], errs[0] = sendD() }()
	go func() { defer wg.Done(); sums[1], errs[1] = sendS() }()
	gotS, nS, errS := drain(s)
	gotD, nD, errD := drain(d)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || errS != nil || errD != nil {
		t.Fatalf("write %v %v, read %v %v", errs[0], errs[1], errS, errD)
	}
	if nS != n || nD != n || gotS != sums[0] || gotD != sums[1] {
		t.Fatalf("got %d and %d bytes, checksums %x/%x want %x/%x", nS, nD, gotS, gotD, sums[0], sums[1])
	}
}

func TestManyStreams(t *testing.T) {
	_, _, _, a, b := pair(t, RandomFault(5, 0.01, 0, 0.02), Config{})
	ctx := ctx10(t)
	ln, _ := Listen(b, StreamConfig{Window: 64 << 10, Chunk: 16 << 10})
	const streams = 40
	var wg sync.WaitGroup
	errc := make(chan error, 2*streams)
	go func() {
		for range streams {
			s, err := ln.Accept(ctx)
			if err != nil {
				errc <- err
				return
			}
			wg.Add(1)
			go func() { // echo
				defer wg.Done()
				if _, err := io.Copy(s, s); err != nil {
					errc <- err
				}
				s.CloseWrite()
			}()
		}
	}()
	var cw sync.WaitGroup
	for i := range streams {
		cw.Add(1)
		go func() {
			defer cw.Done()
			d, err := Dial(ctx, a, b.Addr(), nil, StreamConfig{Window: 64 << 10, Chunk: 16 << 10})
			if err != nil {
				errc <- err
				return
			}
			want := payload(uint64(i), 100000+i)
			go func() { d.Write(want); d.CloseWrite() }()
			got, err := io.ReadAll(d)
			if err != nil || !bytes.Equal(got, want) {
				errc <- errors.Join(err, errors.New("echo differs"))
			}
		}()
	}
	cw.Wait()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

func TestStreamSlowReaderHoldsOnlyItsStream(t *testing.T) {
	// One stream nobody reads must not stop another on the same channel:
	// its writer runs out of stream credit before the channel's buffers.
	_, _, _, a, b := pair(t, nil, Config{Window: 64, Buffers: 256})
	cfg := StreamConfig{Window: 64 << 10, Chunk: 8 << 10}
	stuck, _ := streamPair(t, a, b, cfg)
	blocked := make(chan struct{})
	go func() {
		stuck.Write(make([]byte, 1<<20)) // blocks after 64 KiB
		close(blocked)
	}()
	d, s := streamPair(t, a, b, cfg)
	go pump(d, 2<<20, 3)
	if _, n, err := drain(s); err != nil || n != 2<<20 {
		t.Fatalf("second stream: %d bytes, %v", n, err)
	}
	select {
	case <-blocked:
		t.Fatal("a writer got past its stream window with nobody reading")
	default:
	}
}

func TestStreamResetAndPeerLoss(t *testing.T) {
	_, _, eb, a, b := pair(t, nil, Config{})
	d, s := streamPair(t, a, b, StreamConfig{})
	d.Write([]byte("x"))
	d.Abort()
	buf := make([]byte, 10)
	var err error
	for err == nil {
		_, err = s.Read(buf)
	}
	if !errors.Is(err, ErrReset) {
		t.Fatalf("read after the peer's reset: %v", err)
	}
	// The peer's whole engine goes away: the stream ends with an error,
	// never a clean end of file. As with TCP without keepalives, a channel
	// learns of a crashed peer from a frame that goes unacknowledged, so
	// the stream writes after the crash (had every frame been acknowledged
	// before it, a stream that only reads would wait forever).
	d2, _ := streamPair(t, a, b, StreamConfig{})
	eb.Close()
	go d2.Write([]byte("after the crash"))
	for err = nil; err == nil; {
		_, err = d2.Read(buf)
	}
	if err == io.EOF {
		t.Fatal("a vanished peer looked like a clean end of stream")
	}
	t.Logf("read after the peer's engine closed: %v", err)
}
