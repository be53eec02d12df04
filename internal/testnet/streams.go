package testnet

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The checksummed stream: a sender writes pseudo-random bytes and
// half-closes; SumServer, the destination, answers with the SHA-256 of what
// it read; SendAndCheck compares. A byte lost, duplicated, reordered or
// altered anywhere on the path fails the stream.

// cpuWork gates the CPU-heavy steps (generating and hashing data): streams
// stay concurrent, but at most two goroutines burn CPU at once, so relays
// sharing the test's process are not starved for seconds by thousands of
// runnable goroutines (Go time-slices them 10 ms at a time).
var cpuWork = make(chan struct{}, 2)

// SumServer reads c to its end, writes the SHA-256 of what it read and
// closes: the destination of a checksummed stream (use it with Serve).
func SumServer(c *net.TCPConn) {
	defer c.Close()
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		cpuWork <- struct{}{}
		h.Write(buf[:n])
		<-cpuWork
		if err == io.EOF {
			break
		}
		if err != nil {
			return
		}
	}
	c.Write(h.Sum(nil))
}

// SendAndCheck sends size bytes drawn from r on c, half-closes, and checks
// the SHA-256 a SumServer sends back (within 90 s).
func SendAndCheck(c *net.TCPConn, r *rand.Rand, size int) error {
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for left := size; left > 0; {
		k := min(left, len(buf))
		cpuWork <- struct{}{}
		Fill(r, buf[:k])
		h.Write(buf[:k])
		<-cpuWork
		if _, err := c.Write(buf[:k]); err != nil {
			return fmt.Errorf("write after %d of %d bytes: %w", size-left, size, err)
		}
		left -= k
	}
	return CloseAndCheck(c, h.Sum(nil), size, 90*time.Second)
}

// CloseAndCheck half-closes c after a sender wrote its size bytes, whose
// SHA-256 is sum, and checks the checksum a SumServer sends back within
// wait.
func CloseAndCheck(c *net.TCPConn, sum []byte, size int, wait time.Duration) error {
	if err := c.CloseWrite(); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("reading the checksum of %d bytes: %w", size, err)
	}
	if !bytes.Equal(got, sum) {
		return fmt.Errorf("checksum mismatch for %d bytes: got %x", size, got)
	}
	return nil
}

// StreamSize draws a size in 0..max: log-uniform by default, so the sizes
// cover every order of magnitude up to max while the total stays small
// enough for two shared cores; uniform with MPI5K_FULL=1.
func StreamSize(r *rand.Rand, max int) int {
	if os.Getenv("MPI5K_FULL") != "" {
		return r.IntN(max + 1)
	}
	return int(math.Exp(r.Float64()*math.Log(float64(max)+1))) - 1
}

// Fill writes pseudo-random bytes from r into b, 8 at a time: cheap enough
// to push gigabytes.
func Fill(r *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3], b[i+4], b[i+5], b[i+6], b[i+7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// Streams runs n checksummed streams at once (SendAndCheck) and returns
// the bytes checked and an error per stream that failed. Stream i draws
// its size (size) and bytes from rand.NewPCG(seed, i) and its connection
// from open, whose note (nil if none) adds what the caller knows of a
// failure (a stream's code, a link's error).
func Streams(n int, seed uint64, size func(r *rand.Rand) int, open func() (c *net.TCPConn, note func() string, err error)) (int64, []error) {
	var wg sync.WaitGroup
	var total atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			k := size(r)
			c, note, err := open()
			if err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			defer c.Close()
			if err := SendAndCheck(c, r, k); err != nil {
				if note != nil {
					err = fmt.Errorf("%w (%s)", err, note())
				}
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			total.Add(int64(k))
		}()
	}
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		failed = append(failed, err)
	}
	return total.Load(), failed
}
