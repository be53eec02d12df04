package tcpinfo

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// base is a healthy established connection as a 6.7+ kernel reports it.
func base() Info {
	return Info{Len: endKnown, State: 1, CAState: CAOpen, RTO: 204 * time.Millisecond, RTT: 20 * time.Millisecond,
		SndCwnd: 40, SndSsthresh: InfiniteSsthresh, SegsOut: 1000, Delivered: 990, TotalRetrans: 5, TotalRTO: 1}
}

func kinds(ev []Event) string {
	var b strings.Builder
	for _, e := range ev {
		b.WriteString(e.String())
		b.WriteByte(';')
	}
	return b.String()
}

func TestTrackerEvents(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		change func(p, c *Info)
		dt     time.Duration
		want   string // events in emission order
		check  func(t *testing.T, c Counters)
	}{
		{"nothing", func(p, c *Info) {}, 10 * time.Millisecond, "", nil},
		{"fast retransmit", func(p, c *Info) {
			c.TotalRetrans += 3
			c.CAState = CARecovery
			c.SndCwnd, c.SndSsthresh = 28, 28
			c.Lost = 2
			c.SegsOut += 50
		}, 10 * time.Millisecond,
			"retrans-fast 3;lost 2;ca-state 0->3;ssthresh 2147483647->28;cwnd 40->28;",
			func(t *testing.T, c Counters) {
				if c.RetransFast != 3 || c.RetransRTO != 0 || c.RTOs != 0 || c.Lost != 2 {
					t.Errorf("%+v", c)
				}
			}},
		{"RTO counted by total_rto", func(p, c *Info) {
			c.TotalRetrans += 4
			c.TotalRTO += 2
			c.CAState = CALoss
			c.Backoff = 1
			c.SndCwnd = 1
		}, 500 * time.Millisecond,
			"rto 2;retrans-rto 4;ca-state 0->4;cwnd 40->1;",
			func(t *testing.T, c Counters) {
				if c.RetransRTO != 4 || c.RTOs != 2 || c.RetransFast != 0 || c.IdleRestarts != 0 {
					t.Errorf("%+v", c)
				}
			}},
		{"RTO on an old kernel: backoff grows", func(p, c *Info) {
			p.Len, c.Len = offBusyTime, offBusyTime
			p.TotalRTO, c.TotalRTO = 0, 0
			c.TotalRetrans++
			c.Backoff = 2
		}, 500 * time.Millisecond, "rto 1;retrans-rto 1;", nil},
		{"old kernel, still in Loss: retransmits are RTO's", func(p, c *Info) {
			p.Len, c.Len = offBusyTime, offBusyTime
			p.CAState, c.CAState = CALoss, CALoss
			p.Backoff, c.Backoff = 1, 1
			c.TotalRetrans += 7
		}, 10 * time.Millisecond, "retrans-rto 7;", nil},
		{"leaving Loss: the recovery's retransmits are RTO's", func(p, c *Info) {
			p.CAState, p.Backoff = CALoss, 1
			c.TotalRetrans += 9
			c.SndCwnd = 8
		}, 30 * time.Millisecond, "retrans-rto 9;ca-state 4->0;cwnd 40->8;", nil},
		{"reordering and D-SACK", func(p, c *Info) {
			c.ReordSeen += 2
			c.DSACKDups++
			c.CAState = CADisorder
		}, 10 * time.Millisecond, "reordering 2;spurious-retrans 1;ca-state 0->1;", nil},
		{"idle restart", func(p, c *Info) {
			p.LastDataSent = 50 * time.Millisecond
			c.SndCwnd = 10
			c.SegsOut++
			c.Delivered++
		}, 400 * time.Millisecond, "cwnd 40->10;idle-restart cwnd 40->10 after idle <= 450ms;",
			func(t *testing.T, c Counters) {
				if c.IdleRestarts != 1 || c.CwndChanges != 1 {
					t.Errorf("%+v", c)
				}
			}},
		{"idle restart after one RTO: halved, regrown by 3", func(p, c *Info) {
			c.SndCwnd = 23
			c.SegsOut += 3
			c.Delivered += 3
		}, 300 * time.Millisecond, "cwnd 40->23;idle-restart cwnd 40->23 after idle <= 300ms;", nil},
		{"no restart: gap shorter than RTO", func(p, c *Info) {
			c.SndCwnd = 10
			c.SegsOut++
		}, 150 * time.Millisecond, "cwnd 40->10;", nil},
		{"no restart: nothing sent", func(p, c *Info) {
			c.SndCwnd = 10
		}, time.Second, "cwnd 40->10;", nil},
		{"no restart: small loss-free reduction", func(p, c *Info) {
			c.SndCwnd = 30
			c.SegsOut++
		}, time.Second, "cwnd 40->30;", nil},
		{"no restart: with a retransmission", func(p, c *Info) {
			c.SndCwnd = 10
			c.SegsOut++
			c.TotalRetrans++
		}, time.Second, "retrans-fast 1;cwnd 40->10;", nil},
		{"no restart: in CWR (ECN)", func(p, c *Info) {
			c.SndCwnd = 10
			c.SegsOut++
			c.CAState = CACWR
		}, time.Second, "ca-state 0->2;cwnd 40->10;", nil},
		{"counter wrap", func(p, c *Info) {
			p.TotalRetrans = 0xffffffff
			c.TotalRetrans = 1
		}, 10 * time.Millisecond, "retrans-fast 2;", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := base(), base()
			tc.change(&p, &c)
			var tr Tracker
			if ev := tr.Update(t0, &p, nil); len(ev) != 0 {
				t.Fatalf("first sample gave events %v", ev)
			}
			ev := tr.Update(t0.Add(tc.dt), &c, nil)
			if got := kinds(ev); got != tc.want {
				t.Errorf("events\n got %s\nwant %s", got, tc.want)
			}
			for _, e := range ev {
				if !e.At.Equal(t0.Add(tc.dt)) {
					t.Errorf("event %v at %v", e, e.At)
				}
			}
			if tc.check != nil {
				tc.check(t, tr.C)
			}
		})
	}
}

func TestTrackerBBRNoIdleRestart(t *testing.T) {
	p, c := base(), base()
	c.SndCwnd, c.SegsOut = 4, c.SegsOut+1 // PROBE_RTT
	tr := Tracker{CongestionControl: "bbr"}
	tr.Update(time.Unix(0, 0), &p, nil)
	if got := kinds(tr.Update(time.Unix(1, 0), &c, nil)); got != "cwnd 40->4;" {
		t.Errorf("bbr: %s", got)
	}
}

func TestCountersStats(t *testing.T) {
	var tr Tracker
	for i, rtt := range []time.Duration{10, 20, 30, 40} {
		in := base()
		in.RTT = rtt * time.Millisecond
		in.BusyTime, in.RwndLimited, in.SndbufLimited = time.Second, 250*time.Millisecond, 100*time.Millisecond
		tr.Update(time.Unix(int64(i), 0), &in, nil)
	}
	if m := tr.C.RTTMean(); m != 25*time.Millisecond {
		t.Errorf("mean %v", m)
	}
	// Sample standard deviation of 10,20,30,40 ms = 12.91 ms.
	if sd := tr.C.RTTStdDev(); sd < 12900*time.Microsecond || sd > 12920*time.Microsecond {
		t.Errorf("sd %v", sd)
	}
	r, s, w := tr.C.Fractions()
	if r != 0.25 || s != 0.1 || w < 0.6499 || w > 0.6501 {
		t.Errorf("fractions %v %v %v", r, s, w)
	}
	p, c := base(), base()
	p.BusyTime, p.RwndLimited = time.Second, 500*time.Millisecond
	c.BusyTime, c.RwndLimited, c.SndbufLimited = 1500*time.Millisecond, 600*time.Millisecond, 200*time.Millisecond
	if r, s, w := IntervalFractions(&p, &c); r != 0.2 || s != 0.4 || w < 0.3999 || w > 0.4001 {
		t.Errorf("interval fractions %v %v %v", r, s, w)
	}
	if r, s, w := IntervalFractions(&c, &c); r+s+w != 0 {
		t.Error("idle interval fractions")
	}
	var empty Counters
	if r, s, w := empty.Fractions(); r+s+w != 0 || empty.RTTStdDev() != 0 {
		t.Error("empty counters")
	}
}

func TestSampler(t *testing.T) {
	var mu sync.Mutex
	samples := map[string]int{}
	s := NewSampler(func(c *Conn, at time.Time, in *Info, ev []Event) {
		mu.Lock()
		samples[c.Name]++
		mu.Unlock()
	})
	a := tcpPair(t, "")
	b := tcpPair(t, "cubic")
	ca, err := s.AddConn("a", a)
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := b.SyscallConn()
	var cb *Conn
	rc.Control(func(fd uintptr) { cb = s.AddFD("b", int(fd)) }) // b stays open for the test
	if cb.t.CongestionControl != "cubic" {
		t.Errorf("congestion control %q, want cubic", cb.t.CongestionControl)
	}
	if n := s.SampleAll(); n != 2 {
		t.Fatalf("SampleAll = %d", n)
	}
	a.Write(make([]byte, 1<<20))
	waitAcked(t, a)
	if n := s.SampleAll(); n != 2 {
		t.Fatalf("SampleAll = %d", n)
	}
	if c := ca.Counters(); c.Samples != 2 || c.BytesAcked < 1<<20 {
		t.Errorf("a counters %+v", c)
	}
	if in, _, ok := cb.Last(); !ok || in.State != 1 {
		t.Errorf("b last %+v %v", in, ok)
	}
	if err := s.Sample(ca); err != nil {
		t.Fatal(err)
	}

	// A closed connection fails and leaves the set.
	a.Close()
	if n := s.SampleAll(); n != 1 || s.Len() != 1 {
		t.Errorf("after close: SampleAll = %d, Len = %d", n, s.Len())
	}
	if ca.Err() == nil {
		t.Error("closed conn has no error")
	}
	s.Remove(cb)
	if s.Len() != 0 {
		t.Error("Remove")
	}

	// Run samples periodically until cancelled.
	c := tcpPair(t, "")
	if _, err := s.AddConn("c", c); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, 5*time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := samples["c"]
		mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Run did not sample")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if samples["a"] != 3 || samples["b"] != 3 {
		t.Errorf("samples %v", samples)
	}
}

func TestSamplerNotTCP(t *testing.T) {
	s := NewSampler(nil)
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := s.AddConn("udp", u.(*net.UDPConn)); err != nil {
		t.Fatal(err)
	}
	if n := s.SampleAll(); n != 0 || s.Len() != 0 {
		t.Errorf("UDP socket sampled (%d) or kept (%d)", n, s.Len())
	}
	var in Info
	var r Raw
	if err := Read(-1, &r, &in); err == nil {
		t.Error("Read(-1) succeeded")
	}
}

func TestSampleAllocs(t *testing.T) {
	s := NewSampler(func(*Conn, time.Time, *Info, []Event) {})
	for i := range 4 {
		c := tcpPair(t, "")
		if _, err := s.AddConn("c", c); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			rc, _ := c.SyscallConn()
			rc.Control(func(fd uintptr) { s.AddFD("fd", int(fd)) })
		}
	}
	s.SampleAll()
	if n := testing.AllocsPerRun(50, func() { s.SampleAll() }); n != 0 {
		t.Errorf("SampleAll allocates %v times", n)
	}
	var r Raw
	var in Info
	c := tcpPair(t, "")
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) {
		if n := testing.AllocsPerRun(50, func() { Read(int(fd), &r, &in) }); n != 0 {
			t.Errorf("Read allocates %v times", n)
		}
	})
}

func BenchmarkRead(b *testing.B) {
	c := tcpPair(b, "")
	c.Write(make([]byte, 1<<16))
	rc, _ := c.SyscallConn()
	var r Raw
	var in Info
	rc.Control(func(fd uintptr) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Read(int(fd), &r, &in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	c := tcpPair(b, "")
	var r Raw
	var in Info
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) { ReadRaw(int(fd), &r) })
	b.ReportAllocs()
	for b.Loop() {
		Decode(r.Bytes(), &in)
	}
}

func BenchmarkTrackerUpdate(b *testing.B) {
	p, c := base(), base()
	c.SndCwnd, c.TotalRetrans = 30, c.TotalRetrans+1
	var tr Tracker
	ev := make([]Event, 0, 16)
	at := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		in := &p
		if i%2 == 1 {
			in = &c
		}
		ev = tr.Update(at, in, ev[:0])
	}
}

// BenchmarkSampleAll: one sampling round over 16 connections (per op);
// ns/op / 16 is the cost of one connection's sample.
func BenchmarkSampleAll(b *testing.B) {
	s := NewSampler(func(*Conn, time.Time, *Info, []Event) {})
	for range 16 {
		if _, err := s.AddConn("c", tcpPair(b, "")); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if s.SampleAll() != 16 {
			b.Fatal("lost a connection")
		}
	}
}
