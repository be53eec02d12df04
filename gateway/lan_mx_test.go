package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
)

// mxSite puts site a's LAN on an in-memory Ethernet (loss as given): the
// gateway's MX endpoint and one node's, which plays the node daemon.
func mxSite(t *testing.T, loss float64) (*MXTransport, *mx.Endpoint) {
	hub := mx.NewMemHub(1500)
	if loss > 0 {
		hub.Fault = mx.RandomFault(7, loss, 0, 0.01)
	}
	var eps []*mx.Endpoint
	for _, mac := range []mx.MAC{{2, 0, 0, 0, 1, 1}, {2, 0, 0, 0, 1, 2}} {
		e, err := mx.New(hub.Attach(mac), mx.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		ep, err := e.Open(1)
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	return &MXTransport{EP: eps[0]}, eps[1]
}

// mxOpen does what a node daemon does for a rank: a stream to the gateway
// naming the rank's endpoint, then OPEN, then the application's bytes.
func mxOpen(ctx context.Context, node *mx.Endpoint, gw mx.Addr, lan, src, dst netip.AddrPort) (*mx.Stream, error) {
	meta, err := header.AppendEndpointPair(nil, src, lan)
	if err != nil {
		return nil, err
	}
	s, err := mx.Dial(ctx, node, gw, meta, mx.StreamConfig{})
	if err != nil {
		return nil, err
	}
	body, err := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Label: "mx test"})
	if err != nil {
		return nil, err
	}
	_, err = s.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
	return s, err
}

func sendAndCheck(s *mx.Stream, r *rand.Rand, size int) error {
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for left := size; left > 0; {
		k := min(left, len(buf))
		testnet.Fill(r, buf[:k])
		h.Write(buf[:k])
		if _, err := s.Write(buf[:k]); err != nil {
			return err
		}
		left -= k
	}
	if err := s.CloseWrite(); err != nil {
		return err
	}
	got, err := io.ReadAll(s)
	if err != nil {
		return fmt.Errorf("reading the checksum of %d bytes: %w", size, err)
	}
	if !bytes.Equal(got, h.Sum(nil)) {
		return fmt.Errorf("checksum mismatch for %d bytes", size)
	}
	return nil
}

// TestMXLAN: checksummed streams from a node on site a's MX LAN, through
// gateway a (MX on the LAN), the WAN, and gateway b (kernel TCP) to a
// server; on a clean LAN and with 1 % of the LAN's frames lost.
func TestMXLAN(t *testing.T) {
	for _, loss := range []float64{0, 0.01} {
		t.Run(fmt.Sprintf("loss%v", loss), func(t *testing.T) {
			tr, node := mxSite(t, loss)
			_, a, _ := startPair(t, func(c *Config) {
				if c.Site == "a" {
					c.Transport = tr
				}
			})
			dst := testnet.Serve(t, nodeB, testnet.SumServer)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 40
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(i), 5))
					src := netip.AddrPortFrom(nodeA, uint16(40000+i))
					s, err := mxOpen(ctx, node, tr.EP.Addr(), a.LANAddr(), src, dst)
					if err != nil {
						errs <- err
						return
					}
					defer s.Close()
					if err := sendAndCheck(s, r, testnet.StreamSize(r, 2<<20)); err != nil {
						errs <- fmt.Errorf("stream %d: %w", i, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestMXLANWrongGateway: a stream whose open names another address than
// the gateway's is reset, not served.
func TestMXLANWrongGateway(t *testing.T) {
	tr, node := mxSite(t, 0)
	lan := netip.MustParseAddrPort("127.1.0.1:4000")
	ln, err := tr.Listen(lan)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := tr.Listen(lan); err == nil {
		t.Fatal("a second listener on one endpoint")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := netip.AddrPortFrom(nodeA, 40000)
	type accepted struct {
		c   LANConn
		err error
	}
	acc := make(chan accepted, 1)
	go func() { c, err := ln.Accept(); acc <- accepted{c, err} }()
	bad, err := mxOpen(ctx, node, tr.EP.Addr(), netip.MustParseAddrPort("127.1.0.9:4000"), src, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(bad); !errors.Is(err, mx.ErrReset) {
		t.Fatalf("stream naming another gateway: %v", err)
	}
	good, err := mxOpen(ctx, node, tr.EP.Addr(), lan, src, src)
	if err != nil {
		t.Fatal(err)
	}
	got := <-acc
	c, err := got.c, got.err
	if err != nil {
		t.Fatal(err)
	}
	if c.Remote() != src || c.Local() != lan {
		t.Fatalf("accepted %v -> %v, want %v -> %v", c.Remote(), c.Local(), src, lan)
	}
	good.Close()
}
