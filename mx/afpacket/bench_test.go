//go:build linux

package afpacket

import (
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/internal/testnet"
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
	testnet.In(b, nsL, func() { ln, err = net.Listen("tcp4", ip+":0") })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var c net.Conn
	testnet.In(b, v.nsA, func() { c, err = net.Dial("tcp4", ln.Addr().String()) })
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
	var cfg mx.Config
	if os.Getenv("MXT_MTU") != "" {
		cfg.Buffers = 1024 // 9 KiB frames: bound the pools to 9 MiB per engine
	}
	ea, eb, la, lb := lossyEngines(b, v, 0, cfg, cfg)
	md, ms := streams(b, ea, eb)
	eba, ebb, _, _ := lossyEnginesOn(b, v, "mxc", "mxd", true, 0, cfg, cfg)
	bd, bs := streams(b, eba, ebb)
	td, ts := tcpPair(b, v, v.ipB, v.nsB)
	// The extra hop a rank pays if a per-node daemon carries its MX
	// traffic (docs/architecture.md): loopback TCP inside one host.
	ld, ls := tcpPair(b, v, "127.0.0.1", v.nsA)
	pairs := []struct {
		name string
		a, b conn
	}{{"mx", md, ms}, {"mx-blocking", bd, bs}, {"tcp", td, ts}, {"loopback", ld, ls}}
	rounds := 1
	if r, err := strconv.Atoi(os.Getenv("MXT_ROUNDS")); err == nil && r > 0 {
		rounds = r // side by side, alternating: mx, tcp, loopback, mx, ...
	}
	for range rounds {
		for _, p := range pairs {
			benchPair(b, p.name, p.a, p.b)
		}
		// The goal: small messages at 1 % LAN loss, p99 <= 1 ms.
		la.setLoss(0.01)
		lb.setLoss(0.01)
		benchPair(b, "mx-loss1", md, ms)
		la.setLoss(0)
		lb.setLoss(0)
		// Kernel TCP at the same loss: nftables drops 1 % of the frames
		// each namespace sends on the pair (the kernel has no netem).
		v.dropTCP(b, 1)
		benchPair(b, "tcp-loss1", td, ts)
		v.dropTCP(b, 0)
	}
	b.Logf("mx A %+v", ea.Stats())
}

func benchPair(b *testing.B, name string, pa, pb conn) {
	p := struct {
		name string
		a, b conn
	}{name, pa, pb}
	{
		b.Run("rtt1B/"+p.name, func(b *testing.B) {
			// The echo answers exactly b.N bytes: one that stopped on a
			// signal could see it between two round trips and leave the
			// last byte unanswered.
			n := b.N
			go func() {
				buf := make([]byte, 1)
				for range n {
					if _, err := io.ReadFull(p.b, buf); err != nil {
						return
					}
					p.b.Write(buf)
				}
			}()
			buf := []byte{7}
			lat := make([]time.Duration, b.N)
			cpu := cpuTime()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if _, err := p.a.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(p.a, buf); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-us/op")
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
		})
		if p.name == "loopback" || p.name == "mx-loss1" || p.name == "tcp-loss1" {
			return
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
}

// dropTCP makes each namespace drop pct % of the TCP frames it sends on
// the pair mxa/mxb (an nftables output rule), or none with 0.
func (v *veth) dropTCP(b *testing.B, pct int) {
	for _, x := range []struct{ ns, dev string }{{v.nsA, "mxa"}, {v.nsB, "mxb"}} {
		if pct == 0 {
			testnet.Run(b, "ip", "netns", "exec", x.ns, "nft", "delete", "table", "inet", "mxtloss")
			continue
		}
		testnet.Run(b, "ip", "netns", "exec", x.ns, "nft", fmt.Sprintf(
			"table inet mxtloss { chain out { type filter hook output priority 0; oifname %q meta l4proto tcp numgen random mod 100 < %d drop; }; }",
			x.dev, pct))
	}
}
