package gateway

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/mx"
)

// processCPU is the CPU time of this whole process: the node's MX engine,
// the in-memory LAN, both gateways and the sink all run in it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mxBenchPair is site a on an in-memory MX LAN (gateway a forwarding in
// mode) and site b on loopback TCP, with the production chunk and window.
func mxBenchPair(b *testing.B, mode string) (*MXTransport, *mx.Endpoint, *testGW) {
	tr, node := mxSite(b, 0)
	_, a, _ := startPair(b, func(c *Config) {
		d := DefaultConfig()
		c.Chunk, c.Window = d.Chunk, d.Window
		if c.Site == "a" {
			c.Transport, c.LANForward = tr, mode
		}
	})
	return tr, node, a
}

// BenchmarkMXForward: node-side MX stream -> gateway a (MX LAN, in-memory
// switch) -> WAN link (loopback TCP) -> gateway b -> TCP sink, per LAN
// forwarding mode: bulk up (node to sink), bulk down (a source at site b
// to the node) and 1-byte round trips. Rates per CPU-second count the
// whole process (node engine, LAN, both gateways, sink).
func BenchmarkMXForward(b *testing.B) {
	for _, mode := range lanForwardModes {
		b.Run("up/"+mode, func(b *testing.B) {
			tr, node, a := mxBenchPair(b, mode)
			done := make(chan int64, 1)
			dst := testNodeServe(b, func(c *net.TCPConn) { n, _ := io.Copy(io.Discard, c); done <- n })
			s := mxBenchOpen(b, node, tr, a, dst)
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			cpu, start := processCPU(), time.Now()
			for b.Loop() {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			s.CloseWrite()
			n := <-done
			reportRate(b, n, time.Since(start), processCPU()-cpu)
			s.Close()
		})
		b.Run("down/"+mode, func(b *testing.B) {
			tr, node, a := mxBenchPair(b, mode)
			// The source sends as many bytes as the first 8 bytes ask for.
			dst := testNodeServe(b, func(c *net.TCPConn) {
				var hb [8]byte
				if _, err := io.ReadFull(c, hb[:]); err != nil {
					return
				}
				buf := make([]byte, 1<<20)
				for left := int64(binary.BigEndian.Uint64(hb[:])); left > 0; {
					k, err := c.Write(buf[:min(left, int64(len(buf)))])
					if err != nil {
						return
					}
					left -= int64(k)
				}
				c.CloseWrite()
			})
			s := mxBenchOpen(b, node, tr, a, dst)
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			var hb [8]byte
			binary.BigEndian.PutUint64(hb[:], uint64(b.N)<<20)
			cpu, start := processCPU(), time.Now()
			if _, err := s.Write(hb[:]); err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, s, buf)
			if err != nil || n != int64(b.N)<<20 {
				b.Fatalf("received %d of %d bytes: %v", n, b.N<<20, err)
			}
			reportRate(b, n, time.Since(start), processCPU()-cpu)
			s.Close()
		})
		b.Run("rtt1B/"+mode, func(b *testing.B) {
			tr, node, a := mxBenchPair(b, mode)
			dst := testNodeServe(b, echoServer)
			s := mxBenchOpen(b, node, tr, a, dst)
			buf := []byte{1}
			rt := func() {
				if _, err := s.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(s, buf); err != nil {
					b.Fatal(err)
				}
			}
			roundTrips(b, rt)
			s.Close()
		})
	}
}

func reportRate(b *testing.B, n int64, el, cpu time.Duration) {
	b.ReportMetric(float64(n)/el.Seconds()/1e6, "MB/s")
	if cpu > 0 {
		b.ReportMetric(float64(n)/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}

func testNodeServe(b *testing.B, f func(c *net.TCPConn)) netip.AddrPort {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(nodeB, 0).String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); f(c.(*net.TCPConn)) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func mxBenchOpen(b *testing.B, node *mx.Endpoint, tr *MXTransport, a *testGW, dst netip.AddrPort) *mx.Stream {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := mxOpen(ctx, node, tr.EP.Addr(), a.LANAddr(), netip.AddrPortFrom(nodeA, 40000), dst)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
