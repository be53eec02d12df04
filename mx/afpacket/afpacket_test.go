//go:build linux

package afpacket

import (
	"context"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
)

// lossy drops a fraction of the frames a link sends (netem is not on
// every kernel; the engine's repairs are what is under test).
type lossy struct {
	mx.Link
	mu   sync.Mutex
	r    *rand.Rand
	loss float64
}

func (l *lossy) setLoss(f float64) {
	l.mu.Lock()
	l.loss = f
	l.mu.Unlock()
}

func (l *lossy) Send(b []byte) error {
	l.mu.Lock()
	drop := l.loss > 0 && l.r.Float64() < l.loss
	l.mu.Unlock()
	if drop {
		return nil
	}
	return l.Link.Send(b)
}

// engines runs an engine on each end of v, each behind a lossy link
// (loss: the fraction of frames it drops, settable later with setLoss).
func engines(t testing.TB, v *veth, loss float64, cfgA, cfgB mx.Config) (*mx.Engine, *mx.Engine) {
	ea, eb, _, _ := lossyEngines(t, v, loss, cfgA, cfgB)
	return ea, eb
}

func lossyEngines(t testing.TB, v *veth, loss float64, cfgA, cfgB mx.Config) (*mx.Engine, *mx.Engine, *lossy, *lossy) {
	return lossyEnginesOn(t, v, "mxa", "mxb", false, loss, cfgA, cfgB)
}

func lossyEnginesOn(t testing.TB, v *veth, ifA, ifB string, blocking bool, loss float64, cfgA, cfgB mx.Config) (*mx.Engine, *mx.Engine, *lossy, *lossy) {
	t.Helper()
	var la, lb *Link
	var err error
	testnet.In(t, v.nsA, func() { la, err = open(ifA, blocking) })
	if err != nil {
		t.Fatal(err)
	}
	testnet.In(t, v.nsB, func() { lb, err = open(ifB, blocking) })
	if err != nil {
		t.Fatal(err)
	}
	linkA := &lossy{Link: la, r: rand.New(rand.NewPCG(1, 2)), loss: loss}
	linkB := &lossy{Link: lb, r: rand.New(rand.NewPCG(3, 4)), loss: loss}
	ea, err := mx.New(linkA, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := mx.New(linkB, cfgB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ea.Close(); eb.Close() })
	return ea, eb, linkA, linkB
}

func streams(t testing.TB, ea, eb *mx.Engine) (*mx.Stream, *mx.Stream) {
	t.Helper()
	a, err := ea.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := eb.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := mx.Listen(b, mx.StreamConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := mx.Dial(ctx, a, b.Addr(), nil, mx.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open("mx-no-such-if"); err == nil || !strings.Contains(err.Error(), "mx-no-such-if") {
		t.Fatalf("unknown interface: %v", err)
	}
}

// TestStreamsOverVeth: byte streams in both directions over a real veth
// pair, checksummed end to end, clean and with 1 % and 5 % of frames
// dropped in each direction.
func TestStreamsOverVeth(t *testing.T) {
	v := newVeth(t)
	for i, loss := range []float64{0, 0.01, 0.05} {
		// Both ways of waiting for a frame: the poller (the default) and a
		// read blocked in the kernel.
		blocking := i == 1
		ea, eb, _, _ := lossyEnginesOn(t, v, "mxa", "mxb", blocking, loss, mx.Config{}, mx.Config{})
		d, s := streams(t, ea, eb)
		const n = 8<<20 + 3
		data := make([]byte, n)
		r := rand.New(rand.NewPCG(uint64(loss*100), 9))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		want := crc32.ChecksumIEEE(data)
		var wg sync.WaitGroup
		var werr [2]error
		for i, w := range []*mx.Stream{d, s} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, werr[i] = w.Write(data); werr[i] == nil {
					werr[i] = w.CloseWrite()
				}
			}()
		}
		for _, rd := range []*mx.Stream{s, d} {
			h := crc32.NewIEEE()
			got, err := io.Copy(h, rd)
			if err != nil || got != n || h.Sum32() != want {
				t.Fatalf("loss %v: read %d of %d bytes, crc %x want %x, %v", loss, got, n, h.Sum32(), want, err)
			}
		}
		wg.Wait()
		if werr[0] != nil || werr[1] != nil {
			t.Fatalf("loss %v: writes %v %v", loss, werr[0], werr[1])
		}
		sa := ea.Stats()
		t.Logf("loss %v blocking %v: A %+v", loss, blocking, sa)
		if loss > 0 && sa.Retransmits == 0 {
			t.Fatalf("loss %v without a retransmission", loss)
		}
		ea.Close()
		eb.Close()
	}
}

// TestForeignMACOverVeth: a host outside the allowed set is dropped and
// counted before its frames are decoded.
func TestForeignMACOverVeth(t *testing.T) {
	v := newVeth(t)
	ea, eb := engines(t, v, 0, mx.Config{}, mx.Config{Allow: func(m mx.MAC) bool { return false }})
	a, _ := ea.Open(1)
	b, _ := eb.Open(1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := a.Connect(ctx, b.Addr()); err == nil {
		t.Fatal("a foreign MAC connected")
	}
	if st := eb.Stats(); st.Foreign == 0 || st.Received != 0 {
		t.Fatalf("receiver: %+v", st)
	}
}
