// Package mx is an MX-style messaging engine over raw Ethernet frames
// (docs/mx-wire-format.md): endpoints, sends and receives matched by 64-bit
// match bits and masks, eager messages below a threshold and rendezvous
// (the receiver pulls into its posted buffer) above it, and per-channel
// reliability at LAN time scales: sequence numbers, cumulative and selective
// acknowledgements, retransmission after an RTO measured in microseconds,
// a receive window for flow control, duplicate suppression.
//
// The engine is pure Go and talks to the network through a Link, so tests
// drive it over MemHub (loss, duplication, reordering) and the gateway over
// an AF_PACKET socket (package mx/afpacket). Stream adapts a pair of
// endpoints to a byte stream (Read, Write, CloseWrite, Abort), which is what
// the gateway and the ranks speak.
//
// One mutex guards an engine's state; the receive goroutine, the two timers
// and the API calls take it briefly and never block under it (Link.Send is a
// non-blocking system call on a raw socket). One timer runs the
// retransmissions (tail-loss probe, RTO) while frames are in flight; on
// Linux it is a timerfd, which wakes Go's poller when it is due, where
// Go's own timers fire up to a millisecond late on an idle host. The other
// runs everything else (delayed ACKs, connects, window probes, keepalives)
// on Config.Clock.
package mx

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/mx/wire"
)

// Config tunes an engine. The zero value of a field means its default
// (DefaultConfig); New fills zero fields from it and calls Validate.
type Config struct {
	// EagerMax is the largest message sent eagerly (copied into frames at
	// once); larger ones use rendezvous. Default 8 KiB, at most
	// wire.MaxEager.
	EagerMax int
	// Window is how many frames a channel keeps in flight and accepts out
	// of order. Default 256.
	Window int
	// Buffers is the number of frame buffers in each of the receive and
	// send pools, shared by all channels. Default 4096.
	Buffers int
	// RTOMin and RTOMax bound the retransmission timeout. Defaults 200 µs
	// and 50 ms: a LAN round trip is tens of microseconds.
	RTOMin, RTOMax time.Duration
	// AckDelay is how long a receiver may hold an acknowledgement hoping a
	// reply carries it. Default 20 µs.
	AckDelay time.Duration
	// PeerTimeout fails a channel whose oldest frame goes unacknowledged
	// this long, and a connect that gets no answer. Default 1 s.
	PeerTimeout time.Duration
	// KeepAlive, if set, asks a peer that has sent nothing for this long
	// on an idle channel to answer (an ACK with ACK_NOW), and fails the
	// channel once nothing came for PeerTimeout: a channel with no
	// traffic then learns of a crashed or unplugged peer, which the
	// unacknowledged-frame timer alone sees only at the next send.
	// 0: none.
	KeepAlive time.Duration
	// PullBlock is the size of one PULL; PullAhead how many are
	// outstanding. Defaults 64 KiB and 4.
	PullBlock, PullAhead int
	// Allow, if set, admits frames by source MAC; others are dropped and
	// counted (Stats.Foreign) before they are decoded.
	Allow func(MAC) bool
	// Clock replaces the real clock in tests; it then runs the
	// retransmission timer too.
	Clock Clock
}

// DefaultConfig returns the defaults Config's fields document; Allow and
// Clock stay nil (every source admitted, the real clock).
func DefaultConfig() Config {
	return Config{
		EagerMax:    8 << 10,
		Window:      256,
		Buffers:     4096,
		RTOMin:      200 * time.Microsecond,
		RTOMax:      50 * time.Millisecond,
		AckDelay:    20 * time.Microsecond,
		PeerTimeout: time.Second,
		PullBlock:   64 << 10,
		PullAhead:   4,
	}
}

// fillDefaults gives zero fields their defaults (DefaultConfig).
func (c *Config) fillDefaults() {
	d := DefaultConfig()
	c.EagerMax = cmp.Or(c.EagerMax, d.EagerMax)
	c.Window = cmp.Or(c.Window, d.Window)
	c.Buffers = cmp.Or(c.Buffers, d.Buffers)
	c.PullBlock = cmp.Or(c.PullBlock, d.PullBlock)
	c.PullAhead = cmp.Or(c.PullAhead, d.PullAhead)
	c.RTOMin = cmp.Or(c.RTOMin, d.RTOMin)
	c.RTOMax = cmp.Or(c.RTOMax, d.RTOMax)
	c.AckDelay = cmp.Or(c.AckDelay, d.AckDelay)
	c.PeerTimeout = cmp.Or(c.PeerTimeout, d.PeerTimeout)
}

// Validate reports the first field out of range, zero fields standing for
// their defaults. It checks the Config alone: the frame size is the
// link's (Link.MTU), which New checks when it has the link, so a Config
// can be checked before any link is open (a command line, say).
func (c *Config) Validate() error {
	v := *c
	v.fillDefaults()
	switch {
	case v.EagerMax < 0 || v.EagerMax > wire.MaxEager:
		return fmt.Errorf("mx: EagerMax %d out of range 1..%d (0 takes the default, %d)", v.EagerMax, wire.MaxEager, DefaultConfig().EagerMax)
	case v.Window < 1 || v.Window > 32768:
		return fmt.Errorf("mx: Window %d frames out of range 1..32768 (0 takes the default, %d)", v.Window, DefaultConfig().Window)
	case v.Buffers < 2*v.Window:
		return fmt.Errorf("mx: %d Buffers cannot back a Window of %d frames; give at least %d", v.Buffers, v.Window, 2*v.Window)
	case v.RTOMin <= 0 || v.RTOMax < v.RTOMin:
		return fmt.Errorf("mx: RTOMin %v and RTOMax %v: want 0 < RTOMin <= RTOMax", v.RTOMin, v.RTOMax)
	case v.PullBlock < 1 || v.PullAhead < 1:
		return fmt.Errorf("mx: PullBlock %d and PullAhead %d: want both positive (0 takes the default)", v.PullBlock, v.PullAhead)
	case v.AckDelay < 0 || v.PeerTimeout < 0 || v.KeepAlive < 0:
		return fmt.Errorf("mx: AckDelay %v, PeerTimeout %v, KeepAlive %v: none may be negative (0 takes the default; KeepAlive 0: none)", v.AckDelay, v.PeerTimeout, v.KeepAlive)
	}
	return nil
}

// checkMTU refuses a link whose frames cannot hold a header and a byte
// of payload, or exceed the largest frame the engine buffers.
func checkMTU(mtu int) error {
	if mtu <= wire.Size || mtu > wire.MaxFrame {
		return fmt.Errorf("mx: link MTU %d out of range %d..%d", mtu, wire.Size+1, wire.MaxFrame)
	}
	return nil
}

// Errors a request or call can end with; the returned errors wrap them and
// name the peer.
var (
	ErrTimeout      = errors.New("mx: peer did not answer")
	ErrRejected     = errors.New("mx: peer rejected the channel")
	ErrPeerClosed   = errors.New("mx: peer closed the channel")
	ErrClosed       = errors.New("mx: endpoint closed")
	ErrNotConnected = errors.New("mx: no channel to this peer (Connect first)")
	ErrTruncated    = errors.New("mx: message longer than the receive buffer")
	ErrCanceled     = errors.New("mx: receive canceled")
)

// Stats counts what the engine saw; read with Engine.Stats.
type Stats struct {
	Sent, Received uint64 // frames
	Retransmits    uint64 // frames sent again (timeout or hole)
	Timeouts       uint64 // RTO expiries
	Probes         uint64 // tail-loss probes (counted in Retransmits too)
	Duplicates     uint64 // sequenced frames received twice
	OutOfOrder     uint64 // frames held until the hole before them filled
	NoBuffer       uint64 // frames dropped because the receive pool was empty
	Foreign        uint64 // frames from a MAC outside the allowed set
	Malformed      uint64 // frames the decoder rejected
	Stale          uint64 // frames for no channel or an old session
	SendErrors     uint64 // Link.Send failures
	RTT            time.Duration
}

type counters struct {
	sent, received, retransmits, timeouts, probes, duplicates, outOfOrder,
	noBuffer, foreign, malformed, stale, sendErrors atomic.Uint64
}

// Engine runs the protocol on one link.
type Engine struct {
	cfg  Config
	link Link
	mac  MAC
	mtu  int
	c    counters

	mu        sync.Mutex
	eps       map[uint16]*Endpoint
	rx, tx    *pool
	timer     clockTimer // everything but retransmissions, on Config.Clock
	timerAt   time.Time
	retx      retxTimer // probe and RTO, while frames are in flight
	retxAt    time.Time // when retx fires; zero: not armed
	retxSlack time.Duration
	closed    bool
	scratch   []byte // an Ethernet header + one control frame
	lastRTT   time.Duration
	streamSeq uint64
	done      chan struct{}
	// Requests done whose notify has yet to run (Request.notify), and
	// noting: someone runs them and looks again before it stops.
	notes, spareNotes []*Request
	noting            bool
	noteKick          chan struct{}
}

// New starts an engine on link, cfg's zero fields taking their defaults.
// Close stops it and closes the link.
func New(link Link, cfg Config) (*Engine, error) {
	realTime := cfg.Clock == nil
	if realTime {
		cfg.Clock = realClock{}
	}
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkMTU(link.MTU()); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, link: link, mac: link.MAC(), mtu: link.MTU(),
		eps: map[uint16]*Endpoint{}, done: make(chan struct{}), noteKick: make(chan struct{}, 1)}
	e.timer = clockTimer{clk: cfg.Clock, fire: e.onTimer}
	if realTime {
		if t, err := newFDTimer(e.onRetxTimer); err == nil {
			e.retx, e.retxSlack = t, fdTimerSlack
		}
	}
	if e.retx == nil {
		e.retx = &clockTimer{clk: cfg.Clock, fire: e.onRetxTimer}
	}
	size := wire.EthSize + e.mtu
	e.rx = newPool(cfg.Buffers, size)
	e.tx = newPool(cfg.Buffers, size)
	e.scratch = make([]byte, wire.EthSize+wire.Size+wire.ConnectSize)
	go e.recvLoop()
	go e.noteLoop()
	return e, nil
}

// MAC is the engine's own address.
func (e *Engine) MAC() MAC { return e.mac }

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	rtt := e.lastRTT
	e.mu.Unlock()
	return Stats{Sent: e.c.sent.Load(), Received: e.c.received.Load(),
		Retransmits: e.c.retransmits.Load(), Timeouts: e.c.timeouts.Load(), Probes: e.c.probes.Load(),
		Duplicates: e.c.duplicates.Load(), OutOfOrder: e.c.outOfOrder.Load(),
		NoBuffer: e.c.noBuffer.Load(), Foreign: e.c.foreign.Load(),
		Malformed: e.c.malformed.Load(), Stale: e.c.stale.Load(),
		SendErrors: e.c.sendErrors.Load(), RTT: rtt}
}

// Close closes every endpoint (without waiting for peers) and the link.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	for _, ep := range e.eps {
		ep.closeLocked(false)
	}
	e.timer.stop()
	e.retx.stop()
	e.mu.Unlock()
	err := e.link.Close()
	<-e.done
	e.retx.close()
	return err
}

// Open creates endpoint id.
func (e *Engine) Open(id uint16) (*Endpoint, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if e.eps[id] != nil {
		return nil, fmt.Errorf("mx: endpoint %d is already open on %v", id, e.mac)
	}
	ep := &Endpoint{e: e, id: id, chans: map[Addr]*channel{}, ended: map[Addr]error{}}
	e.eps[id] = ep
	return ep, nil
}

func (e *Engine) recvLoop() {
	defer close(e.done)
	spare := make([]byte, wire.EthSize+e.mtu)
	for {
		e.mu.Lock()
		buf := e.rx.get()
		e.mu.Unlock()
		pooled := buf != nil
		if !pooled {
			buf = spare
		}
		n, err := e.link.Recv(buf)
		if err != nil {
			if pooled {
				e.mu.Lock()
				e.rx.put(buf)
				e.mu.Unlock()
			}
			return
		}
		e.mu.Lock()
		e.noting = true
		kept := e.input(buf[:n], pooled)
		if pooled && !kept {
			e.rx.put(buf)
		}
		notes := len(e.notes) > 0
		if !notes {
			e.noting = false
		}
		e.mu.Unlock()
		if notes {
			e.runNotes()
		}
	}
}

// input handles one received Ethernet frame. pooled says whether buf may
// be kept (it then belongs to the engine until released to e.rx); it
// returns whether it kept it.
func (e *Engine) input(buf []byte, pooled bool) bool {
	if e.closed || len(buf) < wire.EthSize {
		return false
	}
	if buf[12] != wire.EtherType>>8 || buf[13] != wire.EtherType&0xff {
		return false
	}
	var src MAC
	copy(src[:], buf[6:12])
	if e.cfg.Allow != nil && !e.cfg.Allow(src) {
		e.c.foreign.Add(1)
		return false
	}
	f := buf[wire.EthSize:]
	h, err := wire.Decode(f)
	if err != nil {
		e.c.malformed.Add(1)
		return false
	}
	e.c.received.Add(1)
	payload := f[wire.Size : wire.Size+int(h.Len)]
	from := Addr{MAC: src, EP: h.Src}
	ep := e.eps[h.Dst]
	if ep == nil || ep.closed {
		if h.Type == wire.TypeConnect || h.Type.Sequenced() {
			e.sendReject(from, h.Dst, h.Session, wire.RejectNoEndpoint)
		}
		e.c.stale.Add(1)
		return false
	}
	switch h.Type {
	case wire.TypeConnect:
		ep.onConnect(from, &h, payload)
		return false
	case wire.TypeConnectAck:
		ep.onConnectAck(from, &h, payload)
		return false
	case wire.TypeReject:
		// Only a REJECT of our current session counts: one provoked by a
		// stale frame of an earlier channel must not end the new one.
		if ch := ep.chans[from]; ch != nil && h.Session == ch.session {
			reason, _ := wire.ParseReject(payload)
			ch.fail(fmt.Errorf("%w: %v answered REJECT %d", ErrRejected, from, reason))
		}
		return false
	}
	ch := ep.chans[from]
	if ch != nil && ch.state == stateConnecting {
		// The peer opened its side and sent before its CONNECT_ACK
		// reached us (reordering): drop, it resends.
		return false
	}
	if ch == nil || h.Session != ch.peerSession {
		e.c.stale.Add(1)
		e.sendReject(from, ep.id, h.Session, wire.RejectNoChannel)
		return false
	}
	ch.heard = e.now()
	ch.onAck(&h)
	if !h.Type.Sequenced() {
		if h.Flags&wire.FlagAckNow != 0 {
			ch.sendAck(wire.TypeAck)
		}
		return false
	}
	return ch.onSequenced(&h, payload, buf, pooled)
}

// now is the engine clock's time.
func (e *Engine) now() time.Time { return e.cfg.Clock.Now() }

// xmit sends a frame built in b (Ethernet header included) to dst.
func (e *Engine) xmit(dst MAC, b []byte) {
	putEth(b, dst, e.mac)
	if err := e.link.Send(b); err != nil {
		e.c.sendErrors.Add(1)
		return
	}
	e.c.sent.Add(1)
}

// sendReject answers a frame of session that has no channel or endpoint;
// the REJECT names that session so it ends only the channel it concerns.
func (e *Engine) sendReject(to Addr, from uint16, session uint32, reason uint8) {
	h := wire.Header{Type: wire.TypeReject, Dst: to.EP, Src: from, Session: session, Len: 1}
	b := e.scratch[:wire.EthSize+wire.Size+1]
	h.Encode(b[wire.EthSize:])
	b[wire.EthSize+wire.Size] = reason
	e.xmit(to.MAC, b)
}

// arm makes sure the timer fires by t.
func (e *Engine) arm(t time.Time) {
	if e.closed || t.IsZero() || (!e.timerAt.IsZero() && !t.Before(e.timerAt)) {
		return
	}
	e.timerAt = t
	e.timer.set(max(t.Sub(e.now()), 0))
}

// armRetx makes sure the retransmission timer fires by t plus the timer's
// slack. A timer already due by then stays as it is, even if what it was
// armed for has been acknowledged: it fires, finds nothing due and moves
// on to the frames then in flight.
func (e *Engine) armRetx(t time.Time) {
	if e.closed || t.IsZero() {
		return
	}
	t = t.Add(e.retxSlack)
	if !e.retxAt.IsZero() && !e.retxAt.After(t) {
		return
	}
	e.retxAt = t
	e.retx.set(max(t.Sub(e.now()), 0))
}

func (e *Engine) onTimer() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.timerAt = time.Time{}
	e.runTimers()
}

func (e *Engine) onRetxTimer() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.retxAt = time.Time{}
	e.runTimers()
}

// runTimers does what is due on every channel, whichever timer fired, and
// re-arms both for what comes next.
func (e *Engine) runTimers() {
	if e.closed {
		return
	}
	now := e.now()
	var next, retx time.Time
	earliest := func(dst *time.Time, t time.Time) {
		if !t.IsZero() && (dst.IsZero() || t.Before(*dst)) {
			*dst = t
		}
	}
	for _, ep := range e.eps {
		for _, ch := range ep.chans {
			t, r := ch.tick(now)
			earliest(&next, t)
			earliest(&retx, r)
		}
	}
	e.arm(next)
	e.armRetx(retx)
}

// retxTimer is the engine's retransmission timer: one pending expiry,
// moved by set, which calls the engine back. The engine calls it under
// its mutex.
type retxTimer interface {
	set(d time.Duration) // fire once, after d, replacing any pending expiry
	stop()
	close() // after the last set or stop
}

// clockTimer is a timer on Config.Clock: the engine's general timer, and
// its retransmission timer where no timerfd exists and in tests with a
// fake clock.
type clockTimer struct {
	clk  Clock
	fire func()
	t    Timer
}

func (c *clockTimer) set(d time.Duration) {
	c.stop()
	c.t = c.clk.AfterFunc(d, c.fire)
}

func (c *clockTimer) stop() {
	if c.t != nil {
		c.t.Stop()
		c.t = nil
	}
}

func (c *clockTimer) close() {}

// pumpAll lets every channel waiting for send buffers use freed ones.
func (e *Engine) pumpAll() {
	for _, ep := range e.eps {
		for _, ch := range ep.chans {
			if ch.hasWork() {
				ch.pump()
			}
		}
	}
}

func nonce() uint32 {
	var b [4]byte
	for {
		rand.Read(b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}

// Request is a pending send or receive.
type Request struct {
	done chan struct{}
	err  error
	n    int
	// Set when the request completes, for receives.
	match uint64
	from  Addr

	ep         *Endpoint
	buf        []byte
	want, mask uint64
	filter     *Addr
	recv       bool
	in         *inMsg // the message a receive is bound to
	finished   bool
	seq        uint64 // posting order (Endpoint.posted and exact)
	// lazy > 0: buf is taken from the streams' pool, lazy bytes, once a
	// message matches (Endpoint.irecvLazy).
	lazy int
	// notify, if set, runs once the request is done, never under the
	// engine's lock and never from inside an API call: on the engine's
	// receive goroutine right after the frame that finished it, or on
	// its notifier goroutine. It must not block (the receive goroutine
	// waits for it).
	notify func()
}

// Done is closed when the request completes.
func (r *Request) Done() <-chan struct{} { return r.done }

func (r *Request) isDone() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the request completes or ctx ends; for a receive it
// returns the bytes received. A context that ends first leaves the request
// pending.
func (r *Request) Wait(ctx context.Context) (int, error) {
	select {
	case <-r.done:
		return r.n, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Status reports, once Done is closed, what a receive got: its length,
// its match bits and its sender.
func (r *Request) Status() (n int, match uint64, from Addr, err error) {
	<-r.done
	return r.n, r.match, r.from, r.err
}

func (r *Request) finish(err error) {
	if r.finished {
		return
	}
	r.finished = true
	r.err = err
	close(r.done)
	if r.notify != nil {
		r.ep.e.note(r)
	}
}

// note queues r's notify; under e.mu. The receive goroutine runs the
// notes the frame it handles left; other callers (timers, API calls) wake
// the notifier goroutine. Once the engine is closed they run on a
// goroutine of their own.
func (e *Engine) note(r *Request) {
	if e.closed {
		go r.notify()
		return
	}
	e.notes = append(e.notes, r)
	if !e.noting {
		select {
		case e.noteKick <- struct{}{}:
		default:
		}
	}
}

// runNotes runs the queued notes until none is left.
func (e *Engine) runNotes() {
	for {
		e.mu.Lock()
		rs := e.notes
		e.notes, e.spareNotes = e.spareNotes[:0], nil // two runners never share one array
		if len(rs) == 0 {
			e.noting = false
			e.mu.Unlock()
			return
		}
		e.noting = true
		e.mu.Unlock()
		for i, r := range rs {
			r.notify()
			rs[i] = nil
		}
		e.mu.Lock()
		e.spareNotes = rs[:0]
		e.mu.Unlock()
	}
}

// noteLoop runs the notes of requests that timers and API calls finish.
func (e *Engine) noteLoop() {
	for {
		select {
		case <-e.noteKick:
			e.runNotes()
		case <-e.done:
			e.runNotes()
			return
		}
	}
}
