package gateway

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// BenchmarkPerMessage: what the two gateways of a pair spend per forwarded
// small message (rank -> gateway a -> WAN -> gateway b -> rank), as a
// latency-bound code's ping-pong of 64 B, 1 KiB and 4 KiB messages makes
// them, on one stream and on 16 at once. Each gateway runs in its own
// process (startChildren), so gw-cpu-ns/msg is exactly the two gateways'
// CPU (user + system, schedstat of their threads) divided by the messages
// forwarded, two per round trip; the clients and the echo server, in this
// process, are not in it. gw-syscalls/msg counts the read and write family
// (read, readv, write, writev: /proc/pid/io syscr + syscw), not epoll_wait
// or futex; gw-wakeups/msg counts the gateways' threads going to sleep
// (voluntary context switches). ns/op is the wall time of one round trip
// of the whole set of streams, over b.N of them. The direct rows make the
// same round trips without gateways, for the wall time alone.
// MPI5K_PM_BULK=1 adds one stream forwarding bulk as fast as it can beside
// the messages; its CPU is then in the figure too.
func BenchmarkPerMessage(b *testing.B) {
	bulk := os.Getenv("MPI5K_PM_BULK") != ""
	for _, size := range []int{64, 1 << 10, 4 << 10} {
		for _, streams := range []int{1, 16} {
			for _, via := range []string{"gateway", "direct"} {
				b.Run(fmt.Sprintf("%s/size=%d/streams=%d", via, size, streams), func(b *testing.B) {
					perMessage(b, via == "gateway", bulk, size, streams)
				})
			}
		}
	}
}

func perMessage(b *testing.B, gw, bulk bool, size, streams int) {
	dst := testnet.Serve(b, nodeB, echoLoop)
	var pids []int
	dial := func() (*net.TCPConn, error) {
		return net.DialTCP("tcp", &net.TCPAddr{IP: nodeA.AsSlice()}, net.TCPAddrFromAddrPort(dst))
	}
	if gw {
		cp := startChildren(b)
		pids = []int{cp.a.Process.Pid, cp.b.Process.Pid}
		dial = func() (*net.TCPConn, error) { return lanOpen(cp.lan("a"), nodeA, dst) }
		if bulk {
			b.Cleanup(bulkFlow(b, nodeB, func(sink netip.AddrPort) (*net.TCPConn, error) { return lanOpen(cp.lan("a"), nodeA, sink) }))
		}
	}
	conns := make([]*net.TCPConn, streams)
	for i := range conns {
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		c.SetNoDelay(true)
		defer c.Close()
		conns[i] = c
	}
	// rounds makes n round trips on every stream at once.
	rounds := func(n int) {
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				buf := make([]byte, size)
				for range n {
					if _, err := c.Write(buf); err != nil {
						b.Error(err)
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	rounds(200) // streams open, first frames, page faults
	per := max(b.N/streams, 1)
	cpu0, sys0, sw0 := gwCounters(pids)
	b.ResetTimer()
	rounds(per)
	b.StopTimer()
	msgs := float64(2 * per * streams)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(per*streams), "ns/op")
	if gw {
		cpu, sys, sw := gwCounters(pids)
		b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/msgs, "gw-cpu-ns/msg")
		b.ReportMetric(float64(sys-sys0)/msgs, "gw-syscalls/msg")
		b.ReportMetric(float64(sw-sw0)/msgs, "gw-wakeups/msg")
	}
}

// echoLoop echoes c with plain reads and writes (io.Copy would splice).
func echoLoop(c *net.TCPConn) {
	defer c.Close()
	c.SetNoDelay(true)
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// gwCounters sums, over processes pids, their threads' CPU time, their
// read- and write-family system calls and their voluntary context switches.
func gwCounters(pids []int) (cpu time.Duration, syscalls, switches int64) {
	for _, pid := range pids {
		cpu += threadsCPU(pid)
		switches += threadsSwitches(pid)
		syscalls += procIOCalls(pid)
	}
	return cpu, syscalls, switches
}

// procIOCalls is syscr + syscw of /proc/pid/io: the read-family and
// write-family system calls of the process, its exited threads included.
func procIOCalls(pid int) int64 {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	var n int64
	for _, l := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(l, ": ")
		if ok && (k == "syscr" || k == "syscw") {
			x, _ := strconv.ParseInt(v, 10, 64)
			n += x
		}
	}
	return n
}
