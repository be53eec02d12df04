//go:build linux

package afpacket

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/mx"
)

// cpuTime is the process's user+system CPU time: both ends run in this
// process, so it covers the whole exchange, the kernel's share included.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type conn interface {
	io.ReadWriter
}

// tcpPair connects kernel TCP (NODELAY, Go's default) to ip in namespace
// nsL from namespace A: across the veth pair, or over loopback.
func tcpPair(b *testing.B, v *veth, ip, nsL string) (net.Conn, net.Conn) {
	var ln net.Listener
	var err error
	in(b, nsL, func() { ln, err = net.Listen("tcp4", ip+":0") })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	in(b, v.nsA, func() { c, err = net.Dial("tcp4", ln.Addr().String()) })
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// BenchmarkLAN compares MX over AF_PACKET with kernel TCP over one veth
// pair: the 1-byte round trip and the bulk rate, each with the CPU time
// it cost (cpu-us/op). With -count N the sub-benchmarks alternate.
func BenchmarkLAN(b *testing.B) {
	v := newVeth(b)
	ea, eb := engines(b, v, 0, mx.Config{}, mx.Config{})
	md, ms := streams(b, ea, eb)
	td, ts := tcpPair(b, v, v.ipB, v.nsB)
	// The extra hop a rank pays if a per-node daemon carries its MX
	// traffic (docs/architecture.md): loopback TCP inside one host.
	ld, ls := tcpPair(b, v, "127.0.0.1", v.nsA)
	pairs := []struct {
		name string
		a, b conn
	}{{"mx", md, ms}, {"tcp", td, ts}, {"loopback", ld, ls}}
	for _, p := range pairs {
		b.Run("rtt1B/"+p.name, func(b *testing.B) {
			stop := make(chan struct{})
			go func() { // echo
				buf := make([]byte, 1)
				for {
					if _, err := io.ReadFull(p.b, buf); err != nil {
						return
					}
					p.b.Write(buf)
					select {
					case <-stop:
						return
					default:
					}
				}
			}()
			buf := []byte{7}
			cpu := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				if i == b.N-1 {
					close(stop)
				}
				if _, err := p.a.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(p.a, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-us/op")
		})
		if p.name == "loopback" {
			continue
		}
		b.Run("bulk/"+p.name, func(b *testing.B) {
			const chunk = 1 << 20
			b.SetBytes(chunk)
			var got atomic.Int64
			total := int64(b.N) * chunk
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 256<<10)
				for got.Load() < total {
					n, err := p.b.Read(buf)
					got.Add(int64(n))
					if err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			data := make([]byte, chunk)
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				if _, err := p.a.Write(data); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
	b.Logf("mx A %+v", ea.Stats())
}
