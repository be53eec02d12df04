package relay

// Queue control: the hook through which a WAN tuning policy caps the
// receive windows of a trunk's bulk links (package tuning implements it;
// bench/figures/queuecontrol). The relay samples the bulk links' TCP_INFO,
// tells the controller whether messages cross the express link, and
// carries the caps it decides to the peer in CLAMP frames, whose receiver
// sets TCP_WINDOW_CLAMP on its socket. One round:
//
//  1. startQueueControl (Link.start): controlQueue runs, one per trunk,
//     while the trunk has bulk links to cap (queueCapped, queueLinks);
//  2. controlQueue: each bulk link's TCP_INFO (QueueSample), and when the
//     express link last sent a message (lastMessage);
//  3. QueueController.Step (package tuning): the cap (QueueDecision);
//  4. CLAMP frames to the links whose peers must hear it (Link.enqueue,
//     send.go); the peer's reader applies it (recv.go: dispatch,
//     applyClamp).

import (
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// QueueController decides the receive-window cap of a trunk's bulk links.
// One runs per trunk while it has bulk links to cap (Config.QueueControl
// makes it); Step is called from one goroutine at a time.
type QueueController interface {
	// Step takes the live bulk links' samples at now, and when the
	// express link last sent a message (now when the trunk has none, as
	// every message then shares the bulk links' path; zero: never, or
	// queue control should stand aside: Trunk.lastMessage).
	Step(now time.Time, links []QueueSample, lastMessage time.Time) QueueDecision
}

// QueueSample is one bulk link's TCP_INFO as queue control reads it.
type QueueSample struct {
	Link         *Link // tells links apart across samples
	SRTT, MinRTT time.Duration
	Acked        uint64 // bytes acknowledged (tcpi_bytes_acked)
	// Backlog: bytes wait to be sent, in the socket or the link's queues,
	// and the link is not held (a held link waits by choice: its rate is
	// not the path's).
	Backlog  bool
	SndWnd   uint32 // the peer's advertised window (tcpi_snd_wnd)
	Inflight uint32 // bytes sent and not yet acknowledged
}

// QueueDecision is what a controller decided at one step.
type QueueDecision struct {
	Next  time.Duration // when to sample again
	Share uint32        // each bulk link's cap, bytes (0: none)
	Send  []*Link       // the links whose peers must hear Share now (CLAMP)
	// For the link statistics and the debug log: the standing queue
	// estimate, the lifts so far, and key-value pairs to log with a send.
	Queue time.Duration
	Lifts uint64
	Log   []any
}

// queueFirstSample is how long after its start queue control first samples.
const queueFirstSample = 200 * time.Millisecond

// clampLifted is what a receiver sets for CLAMP 0: at least the largest
// window TCP can advertise, so its own buffer tuning decides again.
const clampLifted = 1 << 30

// queueCapped reports whether queue control caps l: a bulk link on a TCP
// socket whose peer applies CLAMP frames, with a controller configured.
func (l *Link) queueCapped() bool {
	return sockOf(l.Conn()) != nil && l.cfg.QueueControl != nil && !l.express && l.peer.Features&header.FeatureClamp != 0
}

// startQueueControl starts the trunk's queue control for a new link it
// caps, unless it runs already.
func (t *Trunk) startQueueControl(l *Link) {
	if !l.queueCapped() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.queueOn {
		t.queueOn = true
		go t.controlQueue(l.cfg.QueueControl(), l.log)
	}
}

// queueLinks returns the live bulk links queue control caps, or none, and
// then marks it stopped in the same critical section, so a link added
// later starts it again.
func (t *Trunk) queueLinks(dst []*Link) []*Link {
	t.mu.Lock()
	defer t.mu.Unlock()
	dst = dst[:0]
	for _, l := range t.links {
		if l != nil && !l.dead.Load() && l.queueCapped() {
			dst = append(dst, l)
		}
	}
	if len(dst) == 0 {
		t.queueOn = false
	}
	return dst
}

// controlQueue runs queue control over the trunk's bulk links until none
// is left.
func (t *Trunk) controlQueue(q QueueController, log *slog.Logger) {
	var in tcpinfo.Info
	var links []*Link
	var ls []QueueSample
	var seen msgSeen
	tm := time.NewTimer(queueFirstSample)
	defer tm.Stop()
	for {
		<-tm.C
		if links = t.queueLinks(links); len(links) == 0 {
			return
		}
		ls = ls[:0]
		for _, l := range links {
			if err := tcpinfo.ReadConn(sockOf(l.Conn()), &in); err != nil {
				continue // closing: the next round finds it dead
			}
			ls = append(ls, QueueSample{Link: l, SRTT: in.RTT, MinRTT: in.MinRTT, Acked: in.BytesAcked,
				Backlog: (in.NotsentBytes > 0 || l.queued.Load() > 0) && !l.held(), SndWnd: in.SndWnd, Inflight: in.Unacked * in.SndMSS})
		}
		now := time.Now()
		d := q.Step(now, ls, t.lastMessage(now, &seen))
		if len(d.Send) > 0 {
			log.Debug("queue control", append([]any{"peer", links[0].peer.Name, "links", len(ls)}, d.Log...)...)
		}
		for _, l := range links {
			l.Stats.Clamp.Store(d.Share)
			l.Stats.QueueDelay.Store(int64(d.Queue))
			l.Stats.ClampLifts.Store(d.Lifts)
		}
		for _, l := range d.Send {
			f := frame{h: header.Header{Type: header.TypeClamp, Length: 4}}
			header.PutU32(f.ctl[:4], d.Share)
			l.enqueue(f, nil)
		}
		tm.Reset(OnGrid(d.Next))
	}
}

// msgSeen is what queue control last saw of the express link: the bytes
// it had sent, and when that count last moved.
type msgSeen struct {
	sent uint64
	at   time.Time
}

// lastMessage is what queue control is told of messages at now: when the
// express link last sent one; now when the trunk has none (every message
// then crosses the bulk links' path); zero (none) while a hold keeps this
// side's messages off the express link. The express controller holds it
// only while another flow keeps the WAN queue full (HoldExpress), where a
// cap would only lose the bulk links' share of the path to that flow, so
// queue control stands aside.
func (t *Trunk) lastMessage(now time.Time, m *msgSeen) time.Time {
	if t.ExpressHeld(now) {
		return time.Time{}
	}
	x, ok := t.expressSent()
	if !ok {
		return now
	}
	if x != m.sent {
		m.sent, m.at = x, now
	}
	return m.at
}

// applyClamp caps this side's receive window as the peer asked (CLAMP).
func (l *Link) applyClamp(n uint32) {
	l.Stats.PeerClamp.Store(n)
	sc := sockOf(l.conn)
	if sc == nil {
		return // not a kernel socket (tests over pipes): nothing to cap
	}
	v := n
	if v == 0 || v > clampLifted {
		v = clampLifted
	}
	rc, err := sc.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, int(v)) })
		if err == nil {
			err = cerr
		}
	}
	if err != nil && !l.dead.Load() && l.clampErrs.Add(1) == 1 {
		l.log.Warn("CLAMP from peer not applied", "peer", l.peer.Name, "link", l.index, "bytes", n, "err", err)
	}
}
