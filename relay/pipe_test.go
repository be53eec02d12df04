package relay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// fakePipe is a PipelinedConn whose sends finish late: a started write's
// buffer is read (hashed) only after a random delay, so a relay that
// reused it before FinishWrite would corrupt the checksum.
type fakePipe struct {
	r      *io.PipeReader // what the application sends
	r2     *rand.Rand
	mu     sync.Mutex
	h      hash.Hash // what the relay delivered, in order
	n      int64
	eof    chan struct{} // CloseWrite
	abort  chan struct{}
	once   sync.Once
	queue  chan []byte // started writes, in order
	done   chan struct{}
	ended  sync.Once
	onAbrt sync.Once
	stall  bool          // started writes never finish
	waited chan struct{} // a FinishWrite has returned after Abort
}

func newFakePipe(r *io.PipeReader, seed uint64) *fakePipe {
	f := &fakePipe{r: r, r2: rand.New(rand.NewPCG(seed, 9)), h: sha256.New(), eof: make(chan struct{}),
		abort: make(chan struct{}), queue: make(chan []byte, pipeDepth), done: make(chan struct{}, pipeDepth),
		waited: make(chan struct{}, 1)}
	go f.sender()
	return f
}

// sender finishes the started writes one by one, each after a delay.
func (f *fakePipe) sender() {
	for p := range f.queue {
		if f.stall {
			<-f.abort
			return
		}
		time.Sleep(time.Duration(f.r2.IntN(200)) * time.Microsecond)
		f.mu.Lock()
		f.h.Write(p)
		f.n += int64(len(p))
		f.mu.Unlock()
		f.done <- struct{}{}
	}
}

func (f *fakePipe) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *fakePipe) Write(p []byte) (int, error) {
	return 0, errors.New("fakePipe: Write, not StartWrite")
}
func (f *fakePipe) StartWrite(p []byte) error {
	select {
	case <-f.abort:
		return errors.New("aborted")
	default:
	}
	f.queue <- p
	return nil
}
func (f *fakePipe) FinishWrite() error {
	select {
	case <-f.done:
		return nil
	case <-f.abort:
		select {
		case f.waited <- struct{}{}:
		default:
		}
		return errors.New("aborted")
	}
}
func (f *fakePipe) CloseWrite() error { f.ended.Do(func() { close(f.eof) }); return nil }
func (f *fakePipe) Abort() error {
	f.onAbrt.Do(func() { close(f.abort) })
	f.r.CloseWithError(errors.New("aborted"))
	return nil
}
func (f *fakePipe) Close() error { f.r.Close(); return nil }

// TestPipelinedConn: streams whose local end is a PipelinedConn carry
// checksummed bytes to an echo server and back whole, in order, to the
// end of stream, with started writes finishing late; and a reset from
// the far end releases an in-stage waiting for a write that never
// finishes.
func TestPipelinedConn(t *testing.T) {
	a, _ := pair(t, Config{Chunk: 32 << 10, Window: 128 << 10})
	echo := testnet.Echo(t, loopback)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pipeEcho(a, echo, uint64(i), 1+i*(300<<10))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	// The far end sends, then resets, while the local end's writes never
	// finish: the stream ends, and its in-stage stops waiting.
	rst := testnet.Serve(t, loopback, func(c *net.TCPConn) {
		c.Write(make([]byte, 96<<10)) // within the window: gateway b reads on and sees the reset
		time.Sleep(50 * time.Millisecond)
		c.SetLinger(0)
		c.Close()
	})
	pr, pw := io.Pipe()
	defer pw.Close()
	f := newFakePipe(pr, 99)
	f.stall = true
	s, err := a.Open(&header.Open{Dst: rst, Src: netip.MustParseAddrPort("127.0.0.1:2")}, f)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the far end's reset did not end the stream")
	}
	select {
	case <-f.waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the in-stage still waits for a write after the stream was reset")
	}
}

func pipeEcho(a *Link, echo netip.AddrPort, seed uint64, size int) error {
	pr, pw := io.Pipe()
	f := newFakePipe(pr, seed)
	o := header.Open{Dst: echo, Src: netip.MustParseAddrPort("127.0.0.1:1")}
	s, err := a.Open(&o, f)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(seed, 1))
	sent := sha256.New()
	sentSum := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 50<<10)
		for left := size; left > 0; {
			k := min(left, 1+r.IntN(len(buf)))
			testnet.Fill(r, buf[:k])
			sent.Write(buf[:k])
			if _, err := pw.Write(buf[:k]); err != nil {
				return
			}
			left -= k
		}
		sentSum <- sent.Sum(nil)
		pw.Close() // end of stream toward the echo server
	}()
	select {
	case <-f.eof:
	case <-s.Done():
		return fmt.Errorf("stream %d ended (code %v) before its end of stream came back", seed, s.Code())
	case <-time.After(30 * time.Second):
		return fmt.Errorf("stream %d: no end of stream after 30 s", seed)
	}
	want := <-sentSum
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.h.Sum(nil); f.n != int64(size) || !bytes.Equal(got, want) {
		return fmt.Errorf("stream %d: %d of %d bytes back, checksums %x, want %x", seed, f.n, size, got[:4], want[:4])
	}
	return nil
}
