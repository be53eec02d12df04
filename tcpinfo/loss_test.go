package tcpinfo

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"golang.org/x/sys/unix"
)

// lossNet is a sender namespace A and a receiver namespace B joined through
// a router namespace R. Loss is real network loss for the sender: packets
// are dropped in R's egress queue toward B (a drop in the sender's own
// qdisc would be reported to TCP as a local error, not a loss).
type lossNet struct {
	a, r, b string
}

func newLossNet(t *testing.T) *lossNet {
	testnet.NeedRoot(t, "tc")
	ns := testnet.Netns(t, "mpi5k-tcpinfo", "a", "r", "b")
	n := &lossNet{a: ns[0], r: ns[1], b: ns[2]}
	testnet.Run(t, "ip", "-n", n.a, "link", "add", "eth0", "type", "veth", "peer", "name", "ra", "netns", n.r)
	testnet.Run(t, "ip", "-n", n.b, "link", "add", "eth0", "type", "veth", "peer", "name", "rb", "netns", n.r)
	testnet.Run(t, "ip", "-n", n.a, "addr", "add", "10.201.1.2/24", "dev", "eth0")
	testnet.Run(t, "ip", "-n", n.r, "addr", "add", "10.201.1.1/24", "dev", "ra")
	testnet.Run(t, "ip", "-n", n.r, "addr", "add", "10.201.2.1/24", "dev", "rb")
	testnet.Run(t, "ip", "-n", n.b, "addr", "add", "10.201.2.2/24", "dev", "eth0")
	for _, l := range [][2]string{{n.a, "eth0"}, {n.b, "eth0"}, {n.r, "ra"}, {n.r, "rb"}} {
		testnet.Run(t, "ip", "-n", l[0], "link", "set", l[1], "up")
	}
	testnet.Run(t, "ip", "-n", n.a, "route", "add", "default", "via", "10.201.1.1")
	testnet.Run(t, "ip", "-n", n.b, "route", "add", "default", "via", "10.201.2.1")
	testnet.Run(t, "ip", "netns", "exec", n.r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return n
}

// shape sets R's queue toward B: a rate and a small byte queue, so a bulk
// sender overflows it; or, with rate "", a queue that drops everything.
func (n *lossNet) shape(t *testing.T, rate string) {
	t.Helper()
	if rate == "" {
		testnet.Run(t, "tc", "-n", n.r, "qdisc", "replace", "dev", "rb", "root", "pfifo", "limit", "0")
		return
	}
	testnet.Run(t, "tc", "-n", n.r, "qdisc", "replace", "dev", "rb", "root", "tbf", "rate", rate, "burst", "16kb", "limit", "24kb")
}

func (n *lossNet) pair(t *testing.T) *net.TCPConn {
	var ln net.Listener
	testnet.In(t, n.b, func() {
		var err error
		if ln, err = net.Listen("tcp", "10.201.2.2:0"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c)
	}()
	var c net.Conn
	testnet.In(t, n.a, func() {
		d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic")
			})
			return serr
		}}
		var err error
		if c, err = d.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// sampleWhile samples c every 5 ms with a Tracker until done is closed,
// then once more so the caller's final state is included.
func sampleWhile(t *testing.T, c *net.TCPConn, tr *Tracker, done <-chan struct{}) (ev []Event) {
	rc, _ := c.SyscallConn()
	var raw Raw
	var info Info
	for last := false; ; {
		var err error
		rc.Control(func(fd uintptr) { err = Read(int(fd), &raw, &info) })
		if err != nil {
			t.Error(err)
			return
		}
		ev = tr.Update(time.Now(), &info, ev)
		if last {
			return
		}
		select {
		case <-done:
			last = true
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestInducedLoss: real losses in a router queue are seen as fast
// retransmissions, a blackout longer than the RTO as RTOs, and the derived
// counts add up to the kernel's totals.
func TestInducedLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	n := newLossNet(t)
	n.shape(t, "100mbit")
	c := n.pair(t)
	tr := Tracker{CongestionControl: "cubic"}
	start := readConn(t, c)
	tr.Update(time.Now(), &start, nil)

	// 1. Bulk transfer through a 24 KB queue: overflow drops, recovered by
	// fast retransmit (SACK).
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<20)
		for range 6 {
			if _, err := c.Write(buf); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	stop := make(chan struct{})
	evc := make(chan []Event)
	go func() { evc <- sampleWhile(t, c, &tr, stop) }()
	<-done
	bulk := waitAcked(t, c)
	close(stop)
	ev := <-evc
	got := tr.C
	t.Logf("bulk 6 MiB at 100 Mbit/s: total_retrans %d, fast %d, after-RTO %d, RTOs %d, lost>=%d, cwnd max %d, %d events",
		bulk.TotalRetrans, got.RetransFast, got.RetransRTO, got.RTOs, got.Lost, got.MaxCwnd, len(ev))
	if bulk.TotalRetrans == 0 {
		t.Fatal("no retransmission through a 24 KB queue: loss not induced")
	}
	if got.RetransFast == 0 {
		t.Errorf("no fast retransmission classified (total %d, rto %d)", bulk.TotalRetrans, got.RetransRTO)
	}
	if got.RetransFast+got.RetransRTO != uint64(bulk.TotalRetrans-start.TotalRetrans) {
		t.Errorf("derived %d+%d retransmissions, kernel %d", got.RetransFast, got.RetransRTO, bulk.TotalRetrans-start.TotalRetrans)
	}
	if got.IdleRestarts != 0 {
		t.Errorf("idle restarts during a bulk transfer: %d", got.IdleRestarts)
	}

	// 2. Blackout: every packet toward B dropped for ~3 RTOs, then healed.
	before := tr.C
	n.shape(t, "")
	if _, err := c.Write(make([]byte, 30000)); err != nil {
		t.Fatal(err)
	}
	stop = make(chan struct{})
	go func() { evc <- sampleWhile(t, c, &tr, stop) }()
	time.Sleep(3*bulk.RTO + 100*time.Millisecond)
	n.shape(t, "100mbit")
	after := waitAcked(t, c)
	close(stop)
	ev = <-evc
	rtos := tr.C.RTOs - before.RTOs
	rtoRetrans := tr.C.RetransRTO - before.RetransRTO
	t.Logf("blackout of %v (rto %v): RTOs %d, retrans after RTO %d, fast %d; kernel total_rto %d->%d; events %v",
		3*bulk.RTO+100*time.Millisecond, bulk.RTO, rtos, rtoRetrans, tr.C.RetransFast-before.RetransFast, bulk.TotalRTO, after.TotalRTO, ev)
	if rtos == 0 || rtoRetrans == 0 {
		t.Errorf("blackout longer than the RTO: %d RTOs, %d RTO retransmissions", rtos, rtoRetrans)
	}
	if after.Has(FieldTotalRTO) && uint64(after.TotalRTO-bulk.TotalRTO) != rtos {
		t.Errorf("RTOs derived %d, kernel total_rto grew by %d", rtos, after.TotalRTO-bulk.TotalRTO)
	}
	if tr.C.IdleRestarts != 0 {
		t.Errorf("a blackout reported as idle restart")
	}
}
