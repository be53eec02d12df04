package relay

import (
	"net"
	"testing"
	"time"

	"math/rand/v2"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
)

// pathModel is a fluid model of one bulk link through a drop-tail
// bottleneck with a 1-BDP buffer, driven in 1 ms steps. The sender's own
// congestion control keeps ccWin in flight (BBR's 2 x BDP, which fills the
// buffer); a receive-window cap reaches the sender one round trip after
// the controller sends it.
type pathModel struct {
	rate       float64              // bottleneck, bytes/s
	r0         time.Duration        // base round trip
	ccWin      float64              // the congestion control's window, bytes
	demand     float64              // the application's offered rate, bytes/s (0 = unlimited)
	foreign    bool                 // another flow keeps the buffer full
	noise      func() time.Duration // added to every srtt (ACK timing), or nil
	noMessages bool                 // no small messages share the bottleneck

	now     time.Time
	clamp   float64 // in force at the sender (0 = none)
	pending []struct {
		at time.Time
		v  uint32
	}
	acked   float64
	backlog bool
	srtt    time.Duration
	queue   time.Duration // this step's queueing delay
}

func (m *pathModel) bdp() float64 { return m.rate * m.r0.Seconds() }

// advance moves the model by 1 ms and returns the bytes delivered.
func (m *pathModel) advance() float64 {
	const dt = time.Millisecond
	m.now = m.now.Add(dt)
	for len(m.pending) > 0 && !m.pending[0].at.After(m.now) {
		m.clamp = float64(m.pending[0].v)
		m.pending = m.pending[1:]
	}
	w := m.ccWin
	if m.clamp > 0 && m.clamp < w {
		w = m.clamp
	}
	var rate float64
	if m.foreign {
		// The buffer stays full: every round trip is 2 x r0 and the link
		// gets what its window carries in that time.
		m.queue = m.r0
		rate = min(w/(2*m.r0.Seconds()), m.rate)
	} else {
		q := min(max(w-m.bdp(), 0), m.bdp())
		m.queue = time.Duration(q / m.rate * float64(time.Second))
		rate = min(w/m.r0.Seconds(), m.rate)
	}
	m.backlog = !(m.demand > 0 && m.demand < rate)
	if !m.backlog {
		rate, m.queue = m.demand, 0
	}
	m.srtt = m.r0 + m.queue
	if m.noise != nil {
		m.srtt += m.noise()
	}
	got := rate * dt.Seconds()
	m.acked += got
	return got
}

func (m *pathModel) sample() queueSample {
	return queueSample{at: m.now, srtt: m.srtt, minRTT: m.r0, acked: uint64(m.acked), backlog: m.backlog, messages: !m.noMessages}
}

// simulate runs c (nil: no queue control) on m for d; change, if set, runs every model step.
// It returns the bytes delivered and the mean queueing delay over the
// last half, and how many CLAMP frames went out.
func simulate(c *queueCtl, m *pathModel, d time.Duration, change func(t time.Duration)) (bytes float64, meanQ time.Duration, frames int) {
	if m.now.IsZero() {
		m.now = time.Unix(1000, 0)
	}
	start := m.now
	nextAt := m.now
	var qsum time.Duration
	var qn int
	for m.now.Sub(start) < d {
		if change != nil {
			change(m.now.Sub(start))
		}
		got := m.advance()
		if m.now.Sub(start) >= d/2 {
			bytes += got
			qsum += m.queue
			qn++
		}
		if c != nil && !m.now.Before(nextAt) {
			next, send := c.step(m.sample())
			if send {
				frames++
				m.pending = append(m.pending, struct {
					at time.Time
					v  uint32
				}{m.now.Add(m.r0), c.sent})
			}
			nextAt = m.now.Add(next)
		}
	}
	return bytes, qsum / time.Duration(max(qn, 1)), frames
}

func newPath(mbit float64, rtt time.Duration) *pathModel {
	m := &pathModel{rate: mbit * 1e6 / 8, r0: rtt}
	m.ccWin = 2 * m.bdp()
	return m
}

// TestQueueCtlAlone: a saturating link alone on its bottleneck settles at
// the target queue without losing throughput, at several rates and RTTs.
func TestQueueCtlAlone(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// What the lab's links show without any queue: srtt 0.5-1 ms above
	// min_rtt (delayed ACKs, the emulator's timer), with spikes.
	lab := func() time.Duration {
		d := 500*time.Microsecond + time.Duration(r.Int64N(int64(500*time.Microsecond)))
		if r.IntN(20) == 0 {
			d += 3 * time.Millisecond
		}
		return d
	}
	for _, tc := range []struct {
		mbit  float64
		rtt   time.Duration
		noise func() time.Duration
	}{{200, 20 * time.Millisecond, nil}, {1000, 18 * time.Millisecond, nil}, {50, 100 * time.Millisecond, nil},
		{10000, 5 * time.Millisecond, nil}, {200, 20 * time.Millisecond, lab}} {
		m := newPath(tc.mbit, tc.rtt)
		m.noise = tc.noise
		c := queueCtl{target: time.Millisecond}
		bytes, q, _ := simulate(&c, m, 10*time.Second, nil)
		util := bytes / (m.rate * 5)
		t.Logf("%g Mbit/s, %v, noise %v: utilisation %.4f, mean queue %v, cap %d (BDP %.0f), lifts %d",
			tc.mbit, tc.rtt, tc.noise != nil, util, q, c.clamp, m.bdp(), c.lifts)
		if util < 0.99 {
			t.Errorf("%g Mbit/s %v: utilisation %.3f below 0.99", tc.mbit, tc.rtt, util)
		}
		if q > 2*time.Millisecond {
			t.Errorf("%g Mbit/s %v: mean queue %v, want <= 2 x the 1 ms target", tc.mbit, tc.rtt, q)
		}
		if c.lifts != 0 || c.clamp == 0 {
			t.Errorf("%g Mbit/s %v: cap %d after %d lifts, want a cap and no lift", tc.mbit, tc.rtt, c.clamp, c.lifts)
		}
	}
}

// TestQueueCtlForeignQueue: against a flow that keeps the buffer full, a
// capped link would spiral down; the controller must lift the cap and get
// nearly what the link gets without queue control.
func TestQueueCtlForeignQueue(t *testing.T) {
	free := newPath(200, 20*time.Millisecond)
	free.foreign = true
	base, _, _ := simulate(nil, free, 60*time.Second, nil)
	m := newPath(200, 20*time.Millisecond)
	m.foreign = true
	c := queueCtl{target: time.Millisecond}
	got, _, _ := simulate(&c, m, 60*time.Second, nil)
	t.Logf("beside a buffer-filling flow: %.1f%% of the uncontrolled link, %d lifts, hold %v", 100*got/base, c.lifts, c.hold)
	if got < 0.9*base {
		t.Errorf("beside a buffer-filling flow the link got %.1f%% of what it gets uncontrolled, want >= 90%%", 100*got/base)
	}
	if c.lifts == 0 {
		t.Error("the cap was never lifted against a foreign queue")
	}
	// When the other flow leaves, the cap comes back (after the hold) and
	// the queue returns to the target.
	m.foreign = false
	_, q, _ := simulate(&c, m, 2*queueHoldMax, nil)
	if c.clamp == 0 || q > 2*time.Millisecond {
		t.Errorf("after the other flow left: cap %d, mean queue %v", c.clamp, q)
	}
}

// TestQueueCtlRateDrop: when the bottleneck rate halves (a WAN reroute,
// or a fair-queued share), the setpoint follows within a few round trips.
func TestQueueCtlRateDrop(t *testing.T) {
	m := newPath(200, 20*time.Millisecond)
	c := queueCtl{target: time.Millisecond}
	simulate(&c, m, 3*time.Second, nil)
	m.rate /= 2
	m.ccWin = 2 * m.bdp()
	bytes, q, _ := simulate(&c, m, 4*time.Second, nil)
	if util := bytes / (m.rate * 2); util < 0.99 || q > 2*time.Millisecond || c.lifts != 0 {
		t.Errorf("after the rate halved: utilisation %.3f, mean queue %v, lifts %d", util, q, c.lifts)
	}
	// And when it doubles back, the cap grows to fill it.
	m.rate *= 2
	m.ccWin = 2 * m.bdp()
	bytes, q, _ = simulate(&c, m, 4*time.Second, nil)
	if util := bytes / (m.rate * 2); util < 0.99 || q > 2*time.Millisecond {
		t.Errorf("after the rate doubled back: utilisation %.3f, mean queue %v", util, q)
	}
}

// TestQueueCtlAppLimited: a link that never fills the bottleneck is never
// capped; a saturating one is, and keeps its cap over an idle period
// without growing it or sending anything; while it saturates, the cap is
// repeated to the peer about every queueRefresh.
func TestQueueCtlAppLimited(t *testing.T) {
	m := newPath(200, 20*time.Millisecond)
	m.demand = m.rate / 2
	c := queueCtl{target: time.Millisecond}
	if _, _, n := simulate(&c, m, 5*time.Second, nil); c.clamp != 0 || n != 0 {
		t.Fatalf("an app-limited link got cap %d (%d frames)", c.clamp, n)
	}
	m.demand = 0
	simulate(&c, m, 2*time.Second, nil)
	if c.clamp == 0 {
		t.Fatal("no cap on a saturating link")
	}
	_, _, n := simulate(&c, m, 2*time.Second, nil)
	if want := int(2 * time.Second / queueRefresh); n < want-2 || n > want+1 {
		t.Errorf("%d CLAMP frames in 2 s of saturation, want about %d (one per %v)", n, want, queueRefresh)
	}
	capped := c.clamp
	m.demand = 1e-9 // idle
	simulate(&c, m, 100*time.Millisecond, nil)
	if _, _, n = simulate(&c, m, 2*time.Second, nil); n != 0 || c.clamp != capped {
		t.Errorf("idle link: cap %d -> %d, %d CLAMP frames", capped, c.clamp, n)
	}
}

// TestQueueCtlRefresh: small changes are not sent, changes above 1/32 are.
func TestQueueCtlRefresh(t *testing.T) {
	c := queueCtl{}
	now := time.Unix(1000, 0)
	c.clamp = 1 << 20
	if !c.refresh(now) || c.sent != 1<<20 {
		t.Fatal("first cap not sent")
	}
	c.clamp = 1<<20 + 1<<14 // +1.6 %
	if c.refresh(now.Add(time.Millisecond)) {
		t.Error("a 1.6 % change was sent")
	}
	c.clamp = 1<<20 + 1<<16 // +6 %
	if !c.refresh(now.Add(2 * time.Millisecond)) {
		t.Error("a 6 % change was not sent")
	}
	c.clamp = 0
	if !c.refresh(now.Add(3*time.Millisecond)) || c.sent != 0 {
		t.Error("lifting was not sent")
	}
	if c.refresh(now.Add(time.Second)) {
		t.Error("no cap, yet a refresh was sent")
	}
}

// TestApplyClamp: a CLAMP frame sets TCP_WINDOW_CLAMP on the receiving
// side's socket, and CLAMP 0 lifts it.
func TestApplyClamp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		done <- c
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2 := <-done
	defer c2.Close()
	l := &Link{conn: WrapTCP(c2.(*net.TCPConn)), cfg: Config{}}
	l.cfg.fill()
	l.log = l.cfg.Logger
	get := func() int {
		rc, _ := c2.(*net.TCPConn).SyscallConn()
		var v int
		rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) })
		return v
	}
	var b [4]byte
	header.PutU32(b[:], 300_000)
	if err := l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:]); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != 300_000 || l.Stats.PeerClamp.Load() != 300_000 {
		t.Fatalf("TCP_WINDOW_CLAMP %d after CLAMP 300000", v)
	}
	header.PutU32(b[:], 0)
	l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:])
	if v := get(); v != clampLifted {
		t.Fatalf("TCP_WINDOW_CLAMP %d after CLAMP 0, want %d", v, clampLifted)
	}
	if err := l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:3]); err == nil {
		t.Fatal("a 3-byte CLAMP body was accepted")
	}
}

// TestQueueCtlOnlyWithMessages: a bulk link with no messages beside it is
// never capped; the cap comes when messages flow and goes (without
// counting as a lift) when they stop.
func TestQueueCtlOnlyWithMessages(t *testing.T) {
	m := newPath(200, 20*time.Millisecond)
	m.noMessages = true
	c := queueCtl{target: time.Millisecond}
	if _, q, n := simulate(&c, m, 3*time.Second, nil); c.clamp != 0 || n != 0 || q < 10*time.Millisecond {
		t.Fatalf("bulk alone: cap %d, %d frames, queue %v (want none, none, the congestion control's)", c.clamp, n, q)
	}
	m.noMessages = false
	if _, q, _ := simulate(&c, m, 3*time.Second, nil); c.clamp == 0 || q > 2*time.Millisecond {
		t.Fatalf("with messages: cap %d, queue %v", c.clamp, q)
	}
	m.noMessages = true
	if _, _, n := simulate(&c, m, time.Second, nil); c.clamp != 0 || c.sent != 0 || n == 0 || c.lifts != 0 {
		t.Fatalf("messages stopped: cap %d, sent %d in %d frames, lifts %d", c.clamp, c.sent, n, c.lifts)
	}
}
