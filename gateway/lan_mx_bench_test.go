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

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/mx/afpacket"
)

// processCPU is the CPU time of this whole process: the node's MX engine,
// the in-memory LAN, both gateways and the sink all run in it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mxLAN builds site a's MX LAN: the gateway's transport and the node's
// endpoint.
type mxLAN func(testing.TB) (*MXTransport, *mx.Endpoint)

// memLAN is the in-memory switch (mx.MemHub).
func memLAN(t testing.TB) (*MXTransport, *mx.Endpoint) { return mxSite(t, 0) }

// vethLAN is a veth pair between two network namespaces this benchmark
// creates (root only), the node's engine on one end and gateway a's on
// the other, each on an AF_PACKET socket as in production; everything
// else (WAN, site b) stays on loopback in this namespace.
func vethLAN(t testing.TB) (*MXTransport, *mx.Endpoint) {
	ns := testnet.Netns(t, "mxfw", "node", "gw")
	testnet.Run(t, "ip", "-n", ns[0], "link", "add", "mxn", "address", "02:00:00:78:00:01", "type", "veth",
		"peer", "name", "mxg", "address", "02:00:00:78:00:02", "netns", ns[1])
	testnet.Run(t, "ip", "-n", ns[0], "link", "set", "mxn", "up")
	testnet.Run(t, "ip", "-n", ns[1], "link", "set", "mxg", "up")
	var eps []*mx.Endpoint
	for _, side := range []struct{ ns, dev string }{{ns[1], "mxg"}, {ns[0], "mxn"}} {
		var link *afpacket.Link
		var err error
		testnet.In(t, side.ns, func() { link, err = afpacket.Open(side.dev) })
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, mxEndpoint(t, link))
	}
	return &MXTransport{EP: eps[0]}, eps[1]
}

// mxBenchPair is site a on an MX LAN (gateway a forwarding in mode) and
// site b on loopback TCP, with the production chunk and window.
func mxBenchPair(b *testing.B, lan mxLAN, mode string) (*MXTransport, *mx.Endpoint, *testGW) {
	tr, node := lan(b)
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
func BenchmarkMXForward(b *testing.B) { benchMXForward(b, memLAN) }

// BenchmarkMXForwardVeth is BenchmarkMXForward with the MX LAN on a veth
// pair and AF_PACKET sockets (root only; the frames cross the kernel).
func BenchmarkMXForwardVeth(b *testing.B) { benchMXForward(b, vethLAN) }

func benchMXForward(b *testing.B, lan mxLAN) {
	for _, mode := range lanForwardModes {
		b.Run("up/"+mode, func(b *testing.B) {
			tr, node, a := mxBenchPair(b, lan, mode)
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
			tr, node, a := mxBenchPair(b, lan, mode)
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
			tr, node, a := mxBenchPair(b, lan, mode)
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
