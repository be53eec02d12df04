package mx

import (
	"fmt"
	"time"

	"github.com/mpi5k/mpi5k/mx/wire"
)

type chanState uint8

const (
	stateConnecting chanState = iota
	stateOpen
	stateDead
)

// ackEvery is how many in-order frames a receiver takes before it
// acknowledges without waiting for AckDelay: often enough that a sender's
// window never waits on the delay.
const ackEvery = 8

// sendItem is queued work that becomes one or more sequenced frames.
type sendItem struct {
	kind     wire.Type
	msg      uint32
	match    uint64
	data     []byte // EAGER: the message; DATA: the rendezvous buffer
	off, end int    // next byte and end (PULL: the range; DATA: what is left to send)
	req      *Request
	started  bool
}

// txFrame is a sent, unacknowledged frame.
type txFrame struct {
	buf    []byte // pooled; Ethernet header + MX frame
	n      int
	seq    uint32
	sentAt time.Time
	retx   int
	sacked bool
}

// channel is the reliable, ordered frame path between a local endpoint and
// one peer endpoint, with the message state that rides on it.
type channel struct {
	ep          *Endpoint
	peer        Addr
	state       chanState
	err         error
	session     uint32 // ours
	peerSession uint32
	mtu         int // largest MX frame both ends accept

	connWait     chan struct{}
	connectStart time.Time
	connectNext  time.Time
	connectTries int

	// Sending.
	sndNext, sndUna uint32
	sndEdge         uint32 // the peer accepts seq < sndEdge
	inflight        []*txFrame
	ctl, queue      []*sendItem // control first, then messages in order
	msgNext         uint32
	rndv            map[uint32]*Request // large sends waiting for PULL/DONE
	srtt, rttvar    time.Duration
	rto             time.Duration
	backoff         uint
	probed          bool // the tail-loss probe went out since the last progress
	lastProgress    time.Time
	heard, keepAt   time.Time // last frame from the peer; next keepalive (Config.KeepAlive)
	probeAt         time.Time

	// Receiving.
	rcvNext  uint32
	ooo      map[uint32]*rxFrame
	ackOwed  int
	ackTimer Timer // a delayed ACK is due: its timer, stopped when a frame carries it
	advWin   uint16
	rxMsgs   map[uint32]*inMsg // eager messages partly arrived
	pulls    map[uint32]*inMsg // rendezvous receives being pulled
}

type rxFrame struct {
	h       wire.Header
	payload []byte
	buf     []byte
}

func (ep *Endpoint) newChannel(to Addr) *channel {
	ch := &channel{ep: ep, peer: to, session: nonce(), mtu: ep.e.mtu,
		rndv: map[uint32]*Request{}, ooo: map[uint32]*rxFrame{},
		rxMsgs: map[uint32]*inMsg{}, pulls: map[uint32]*inMsg{},
		rto: ep.e.cfg.RTOMin * 5}
	ch.rto = min(max(ch.rto, ep.e.cfg.RTOMin), ep.e.cfg.RTOMax)
	ep.chans[to] = ch
	delete(ep.ended, to)
	return ch
}

func (ch *channel) open(peerSession uint32, peerMTU int, window uint16) {
	ch.state = stateOpen
	ch.peerSession = peerSession
	ch.heard = ch.ep.e.now()
	if ka := ch.ep.e.cfg.KeepAlive; ka > 0 {
		ch.ep.e.arm(ch.heard.Add(ka))
	}
	ch.mtu = min(ch.ep.e.mtu, peerMTU)
	ch.sndEdge = ch.sndNext + uint32(window)
	if ch.connWait != nil {
		close(ch.connWait)
		ch.connWait = nil
	}
	ch.pump()
}

// window is how many frames beyond rcvNext this end accepts now: bounded
// by the configured window and by free receive buffers, so a receiver whose
// application does not drain its unexpected messages stops its peers
// instead of dropping their frames.
func (ch *channel) window() uint16 {
	e := ch.ep.e
	w := min(e.cfg.Window, len(e.rx.free)-2+len(ch.ooo))
	return uint16(max(w, 0))
}

func (ch *channel) sendConnect(t wire.Type) {
	e := ch.ep.e
	h := wire.Header{Type: t, Dst: ch.peer.EP, Src: ch.ep.id, Session: ch.session,
		Window: ch.window(), Len: wire.ConnectSize}
	if t == wire.TypeConnectAck {
		h.Ack = ch.peerSession
	}
	b := e.scratch[:wire.EthSize+wire.Size+wire.ConnectSize]
	h.Encode(b[wire.EthSize:])
	wire.AppendConnect(b[:wire.EthSize+wire.Size], wire.Connect{MaxFrame: uint16(e.mtu)})
	e.xmit(ch.peer.MAC, b)
	if t == wire.TypeConnect {
		ch.connectTries++
		ch.connectNext = e.now().Add(min(e.cfg.RTOMax, ch.rto<<min(ch.connectTries, 10)))
		e.arm(ch.connectNext)
	}
}

// sack is the selective-acknowledgement bitmap of frames held beyond the
// first hole.
func (ch *channel) sack() uint32 {
	var s uint32
	for seq := range ch.ooo {
		if d := seq - ch.rcvNext - 1; d < 32 {
			s |= 1 << d
		}
	}
	return s
}

func (ch *channel) sendAck(t wire.Type) {
	e := ch.ep.e
	ch.advWin = ch.window()
	h := wire.Header{Type: t, Dst: ch.peer.EP, Src: ch.ep.id, Session: ch.session,
		Ack: ch.rcvNext, Sack: ch.sack(), Window: ch.advWin}
	b := e.scratch[:wire.EthSize+wire.Size]
	h.Encode(b[wire.EthSize:])
	e.xmit(ch.peer.MAC, b)
	ch.acked()
}

// acked notes that a frame carried the acknowledgement: the delayed ACK's
// timer, if any, is stopped rather than left to fire for nothing (in a
// request-reply exchange the reply carries it, once per round trip).
func (ch *channel) acked() {
	ch.ackOwed = 0
	ch.stopAckTimer()
}

func (ch *channel) stopAckTimer() {
	if ch.ackTimer != nil {
		ch.ackTimer.Stop()
		ch.ackTimer = nil
	}
}

// onAckTimer sends the ACK no frame carried within AckDelay.
func (ch *channel) onAckTimer() {
	e := ch.ep.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed && ch.state == stateOpen && ch.ackTimer != nil {
		ch.sendAck(wire.TypeAck)
	}
}

// windowUpdate tells the peer about buffers freed after this end had
// advertised a nearly closed window, so a stopped sender resumes without
// waiting for its probe.
func (ch *channel) windowUpdate() {
	if ch.state == stateOpen && int(ch.advWin) < ch.ep.e.cfg.Window/4 && ch.window() > ch.advWin {
		ch.sendAck(wire.TypeAck)
	}
}

func (ch *channel) hasWork() bool {
	return ch.state == stateOpen && (len(ch.ctl) > 0 || len(ch.queue) > 0)
}

// pump sends queued work while the peer's window and the send pool allow.
func (ch *channel) pump() {
	e := ch.ep.e
	sent := false
	defer func() {
		if sent {
			e.armRetx(ch.retxDue()) // once for the burst: its last frame's probe
		}
	}()
	for ch.hasWork() && wire.SeqLess(ch.sndNext, ch.sndEdge) && len(ch.inflight) < e.cfg.Window {
		buf := e.tx.get()
		if buf == nil {
			return // pumpAll resumes when acknowledgements free buffers
		}
		n := ch.build(buf)
		f := &txFrame{buf: buf, n: n, seq: ch.sndNext}
		ch.sndNext++
		if len(ch.inflight) == 0 {
			ch.lastProgress = e.now()
		}
		ch.inflight = append(ch.inflight, f)
		ch.transmit(f)
		sent = true
	}
	if ch.hasWork() && len(ch.inflight) == 0 && ch.probeAt.IsZero() {
		// Window closed with nothing in flight: probe until it opens.
		ch.probeAt = e.now().Add(ch.curRTO())
		e.arm(ch.probeAt)
	}
}

// build writes the next frame of the head work item into buf and returns
// its length (Ethernet header included).
func (ch *channel) build(buf []byte) int {
	q := &ch.queue
	if len(ch.ctl) > 0 {
		q = &ch.ctl
	}
	it := (*q)[0]
	h := wire.Header{Type: it.kind, Dst: ch.peer.EP, Src: ch.ep.id, Session: ch.session,
		Seq: ch.sndNext, Msg: it.msg}
	room := ch.mtu - wire.Size
	var payload []byte
	last := true
	switch it.kind {
	case wire.TypeEager:
		h.Match, h.MsgLen, h.Offset = it.match, uint32(len(it.data)), uint32(it.off)
		end := min(len(it.data), it.off+room)
		payload = it.data[it.off:end]
		it.off = end
		last = end == len(it.data)
	case wire.TypeRTS:
		h.Match, h.MsgLen = it.match, uint32(len(it.data))
	case wire.TypePull:
		h.Offset, h.MsgLen = uint32(it.off), uint32(it.end-it.off)
	case wire.TypeData:
		h.MsgLen, h.Offset = uint32(len(it.data)), uint32(it.off)
		end := min(it.end, it.off+room)
		payload = it.data[it.off:end]
		it.off = end
		last = end == it.end
	}
	h.Len = uint16(len(payload))
	n := copy(buf[wire.EthSize+wire.Size:], payload) + wire.EthSize + wire.Size
	h.Encode(buf[wire.EthSize:])
	if last {
		*q = (*q)[1:]
		if it.kind == wire.TypeEager {
			it.req.finish(nil) // copied: the caller may reuse its buffer
		}
	}
	return n
}

// transmit (re)sends f with the current acknowledgement fields.
func (ch *channel) transmit(f *txFrame) {
	e := ch.ep.e
	ch.advWin = ch.window()
	b := f.buf[:f.n]
	wire.PutAck(b[wire.EthSize:], ch.rcvNext, ch.sack(), ch.advWin)
	ch.acked()
	f.sentAt = e.now()
	e.xmit(ch.peer.MAC, b)
}

// probeDue is when the newest frame in flight is probed: when it has had
// two round trips to be answered and nothing follows it (zero if the probe
// went out since the last progress, or frames wait to be sent).
func (ch *channel) probeDue() time.Time {
	if len(ch.inflight) == 0 {
		return timeNever
	}
	newest := ch.inflight[len(ch.inflight)-1]
	if ch.probed || ch.srtt == 0 || ch.hasWork() || newest.sacked {
		return timeNever
	}
	return newest.sentAt.Add(ch.pto())
}

// rtoStart is when the oldest frame the peer holds no copy of started its
// RTO: it restarts on every acknowledgement that makes progress (RFC 6298
// 5.3), since a frame at the back of a full window waits for the frames
// before it, which is queueing, not loss. Zero when every frame in flight
// is held by the peer.
func (ch *channel) rtoStart() time.Time {
	for _, f := range ch.inflight {
		if !f.sacked {
			if ch.lastProgress.After(f.sentAt) {
				return ch.lastProgress
			}
			return f.sentAt
		}
	}
	return timeNever
}

// retxDue is the channel's next retransmission deadline, probe or RTO
// (zero with nothing in flight).
func (ch *channel) retxDue() time.Time {
	t := ch.probeDue()
	if start := ch.rtoStart(); !start.IsZero() {
		if rto := start.Add(ch.curRTO()); t.IsZero() || rto.Before(t) {
			t = rto
		}
	}
	return t
}

// pto is the tail-loss probe's timeout: two smoothed round trips, at
// least half the RTO floor (a LAN round trip is tens of microseconds, a
// timer's wake-up on a loaded host about as long).
func (ch *channel) pto() time.Duration {
	return min(max(2*ch.srtt, ch.ep.e.cfg.RTOMin/2), ch.curRTO())
}

func (ch *channel) curRTO() time.Duration {
	return min(ch.rto<<min(ch.backoff, 16), ch.ep.e.cfg.RTOMax)
}

// onAck applies the acknowledgement fields of any frame from the peer.
func (ch *channel) onAck(h *wire.Header) {
	e := ch.ep.e
	now := e.now()
	if wire.SeqLess(ch.sndUna, h.Ack) && !wire.SeqLess(ch.sndNext, h.Ack) {
		var sample time.Duration
		filled := false
		for len(ch.inflight) > 0 && wire.SeqLess(ch.inflight[0].seq, h.Ack) {
			f := ch.inflight[0]
			// Karn: a resent frame's echo is ambiguous, and so is every
			// frame acknowledged with it: the peer held them until the
			// hole filled.
			filled = filled || f.retx > 0
			if !filled && !f.sacked {
				sample = now.Sub(f.sentAt)
			}
			e.tx.put(f.buf)
			ch.inflight[0] = nil
			ch.inflight = ch.inflight[1:]
		}
		ch.sndUna = h.Ack
		ch.lastProgress = now
		ch.backoff = 0
		ch.probed = false
		if sample > 0 {
			ch.rttSample(sample)
		}
		defer e.pumpAll() // freed send buffers may unblock any channel
	}
	if edge := h.Ack + uint32(h.Window); !wire.SeqLess(edge, ch.sndEdge) || h.Window == 0 {
		ch.sndEdge = edge
	}
	if h.Window > 0 {
		ch.probeAt = timeNever
	}
	if h.Sack != 0 {
		ch.resendHoles(h, now)
	}
	ch.pump()
	// Progress may have brought the deadline forward (backoff reset).
	e.armRetx(ch.retxDue())
}

// rttSample updates the RTO from one round trip (RFC 6298).
func (ch *channel) rttSample(r time.Duration) {
	cfg := &ch.ep.e.cfg
	if ch.srtt == 0 {
		ch.srtt, ch.rttvar = r, r/2
	} else {
		d := ch.srtt - r
		if d < 0 {
			d = -d
		}
		ch.rttvar = (3*ch.rttvar + d) / 4
		ch.srtt = (7*ch.srtt + r) / 8
	}
	ch.rto = min(max(ch.srtt+4*ch.rttvar, cfg.RTOMin), cfg.RTOMax)
	ch.ep.e.lastRTT = ch.srtt
}

// resendHoles resends the frames the peer reports missing below the
// highest one it holds, at most once per round trip each.
func (ch *channel) resendHoles(h *wire.Header, now time.Time) {
	top := -1
	for i := 31; i >= 0; i-- {
		if h.Sack&(1<<i) != 0 {
			top = i
			break
		}
	}
	if top < 0 {
		return
	}
	highest := h.Ack + 1 + uint32(top)
	// Without a round-trip sample yet the gap is the RTO: a LAN round
	// trip on a loaded host can be milliseconds, and resending every hole
	// on every SACK then feeds itself (each duplicate draws an ACK, each
	// ACK more resends, and Karn's rule keeps the sample from coming).
	gap := ch.curRTO()
	if ch.srtt > 0 {
		gap = max(ch.srtt, ch.ep.e.cfg.RTOMin/4)
	}
	for _, f := range ch.inflight {
		if wire.SeqLess(highest, f.seq) {
			break
		}
		if d := f.seq - h.Ack - 1; f.seq != h.Ack && d < 32 && h.Sack&(1<<d) != 0 {
			// No RTT sample here: a frame held beyond the 32 frames a
			// SACK covers is reported late.
			f.sacked = true
			continue
		}
		if now.Sub(f.sentAt) >= gap {
			f.retx++
			ch.ep.e.c.retransmits.Add(1)
			ch.transmit(f)
		}
	}
}

// onSequenced delivers a sequenced frame in order, holds it if it came
// early, or drops a duplicate. It returns whether it kept buf.
func (ch *channel) onSequenced(h *wire.Header, payload, buf []byte, pooled bool) bool {
	e := ch.ep.e
	if wire.SeqLess(h.Seq, ch.rcvNext) || ch.ooo[h.Seq] != nil {
		e.c.duplicates.Add(1)
		ch.sendAck(wire.TypeAck) // our acknowledgement was lost
		return false
	}
	if h.Seq != ch.rcvNext {
		if h.Seq-ch.rcvNext >= uint32(e.cfg.Window) || !pooled {
			e.c.noBuffer.Add(1)
			return false
		}
		e.c.outOfOrder.Add(1)
		ch.ooo[h.Seq] = &rxFrame{h: *h, payload: payload, buf: buf}
		ch.sendAck(wire.TypeNack)
		return true
	}
	if !pooled && ch.needsBuffer(h) {
		e.c.noBuffer.Add(1)
		return false
	}
	kept := ch.deliver(h, payload, buf)
	ch.rcvNext++
	for ch.state == stateOpen {
		f := ch.ooo[ch.rcvNext]
		if f == nil {
			break
		}
		delete(ch.ooo, ch.rcvNext)
		if !ch.deliver(&f.h, f.payload, f.buf) {
			e.rx.put(f.buf)
		}
		ch.rcvNext++
	}
	if ch.state != stateOpen {
		return kept
	}
	ch.ackOwed++
	if ch.ackOwed >= ackEvery || h.Flags&wire.FlagAckNow != 0 || len(ch.ooo) > 0 {
		ch.sendAck(wire.TypeAck)
	} else if ch.ackTimer == nil {
		ch.ackTimer = e.cfg.Clock.AfterFunc(e.cfg.AckDelay, ch.onAckTimer)
	}
	return kept
}

// needsBuffer reports whether delivering h keeps its frame: an eager
// fragment no receive has claimed waits in the unexpected queue.
func (ch *channel) needsBuffer(h *wire.Header) bool {
	if h.Type != wire.TypeEager || h.Len == 0 {
		return false
	}
	if m := ch.rxMsgs[h.Msg]; m != nil {
		return m.req == nil
	}
	r, _ := ch.ep.first(ch.peer, h.Match)
	return r == nil
}

// deliver acts on an in-order sequenced frame; it returns whether it kept
// buf (an unexpected eager fragment).
func (ch *channel) deliver(h *wire.Header, payload, buf []byte) bool {
	ep := ch.ep
	switch h.Type {
	case wire.TypeEager:
		m := ch.rxMsgs[h.Msg]
		if m == nil {
			if h.Offset != 0 {
				return false // the rest of a message a truncating receive dropped
			}
			m = &inMsg{ch: ch, match: h.Match, msg: h.Msg, length: int(h.MsgLen)}
			if r := ep.match(ch.peer, h.Match); r != nil {
				m.bind(r)
			} else {
				ep.unexpected = append(ep.unexpected, m)
				ch.rxMsgs[h.Msg] = m
			}
		}
		m.got += len(payload)
		if m.req == nil {
			if len(payload) == 0 {
				return false
			}
			m.frames = append(m.frames, buf)
			m.parts = append(m.parts, payload)
			return true
		}
		if int(h.Offset) < len(m.req.buf) {
			copy(m.req.buf[h.Offset:], payload)
		}
		if m.got == m.length {
			m.complete()
		}
	case wire.TypeRTS:
		m := &inMsg{ch: ch, match: h.Match, msg: h.Msg, length: int(h.MsgLen), rts: true}
		if r := ep.match(ch.peer, h.Match); r != nil {
			m.bind(r)
		} else {
			ep.unexpected = append(ep.unexpected, m)
		}
	case wire.TypePull:
		r := ch.rndv[h.Msg]
		if r == nil || uint64(h.Offset)+uint64(h.MsgLen) > uint64(len(r.buf)) {
			ep.e.c.malformed.Add(1)
			return false
		}
		ch.queue = append(ch.queue, &sendItem{kind: wire.TypeData, msg: h.Msg, data: r.buf,
			off: int(h.Offset), end: int(h.Offset + h.MsgLen)})
		ch.pump()
	case wire.TypeData:
		m := ch.pulls[h.Msg]
		if m == nil || int(h.Offset)+len(payload) > m.want() {
			ep.e.c.malformed.Add(1)
			return false
		}
		copy(m.req.buf[h.Offset:], payload)
		m.got += len(payload)
		if m.got == m.want() {
			m.rndvDone()
		} else if m.pulled-m.got <= (ep.e.cfg.PullAhead-1)*ep.e.cfg.PullBlock {
			m.pullMore()
		}
	case wire.TypeDone:
		if r := ch.rndv[h.Msg]; r != nil {
			delete(ch.rndv, h.Msg)
			r.finish(nil)
		}
	case wire.TypeDisconnect:
		ch.sendAck(wire.TypeAck)
		ch.fail(fmt.Errorf("%w: %v", ErrPeerClosed, ch.peer))
	}
	return false
}

// tick runs the channel's timers and returns its next deadlines: next for
// the engine's clock, retx (probe, RTO, peer timeout while frames are in
// flight) for its retransmission timer.
func (ch *channel) tick(now time.Time) (next, retx time.Time) {
	e := ch.ep.e
	dueOn := func(dst *time.Time, t time.Time) bool {
		if t.IsZero() {
			return false
		}
		if !t.After(now) {
			return true
		}
		if dst.IsZero() || t.Before(*dst) {
			*dst = t
		}
		return false
	}
	due := func(t time.Time) bool { return dueOn(&next, t) }
	dueRetx := func(t time.Time) bool { return dueOn(&retx, t) }
	switch ch.state {
	case stateConnecting:
		if now.Sub(ch.connectStart) >= e.cfg.PeerTimeout {
			ch.fail(fmt.Errorf("%w: no CONNECT_ACK from %v in %v", ErrTimeout, ch.peer, e.cfg.PeerTimeout))
			return timeNever, timeNever
		}
		if due(ch.connectNext) {
			ch.sendConnect(wire.TypeConnect)
			due(ch.connectNext)
		}
		return next, retx
	case stateDead:
		return timeNever, timeNever
	}
	if len(ch.inflight) > 0 {
		if now.Sub(ch.lastProgress) >= e.cfg.PeerTimeout {
			ch.fail(fmt.Errorf("%w: %v acknowledged nothing for %v", ErrTimeout, ch.peer, e.cfg.PeerTimeout))
			return timeNever, timeNever
		}
		// Tail-loss probe: when the newest frame has had two round trips
		// to be answered and nothing follows it, send it again once. A
		// lost lone message (or its reply) then costs a few round trips,
		// not an RTO inflated by this host's scheduling jitter; the probe's
		// acknowledgement (or SACK) shows what else is missing.
		if dueRetx(ch.probeDue()) {
			newest := ch.inflight[len(ch.inflight)-1]
			ch.probed = true
			newest.retx++
			e.c.retransmits.Add(1)
			e.c.probes.Add(1)
			ch.transmit(newest)
			// A timer that fired late finds the RTO due too: the probe
			// is this turn's retransmission, and the RTO counts from it.
			dueRetx(now.Add(ch.curRTO()))
		} else if start := ch.rtoStart(); !start.IsZero() && dueRetx(start.Add(ch.curRTO())) {
			e.c.timeouts.Add(1)
			ch.backoff++
			// Resend a burst, not one frame: on a LAN a loss is more
			// often a full receive ring (many frames) than one frame.
			n := 0
			for _, f := range ch.inflight {
				if f.sacked {
					continue
				}
				if n == 32 {
					break
				}
				f.retx++
				e.c.retransmits.Add(1)
				ch.transmit(f)
				n++
			}
			dueRetx(now.Add(ch.curRTO()))
		}
		dueRetx(ch.lastProgress.Add(e.cfg.PeerTimeout))
	} else if ch.hasWork() && due(ch.probeAt) {
		// A shut window may be a slow reader, not a dead peer: probing
		// goes on (one small frame per RTO) and never fails the channel.
		ch.backoff++
		h := wire.Header{Type: wire.TypeAck, Flags: wire.FlagAckNow, Dst: ch.peer.EP, Src: ch.ep.id,
			Session: ch.session, Ack: ch.rcvNext, Sack: ch.sack(), Window: ch.window()}
		b := e.scratch[:wire.EthSize+wire.Size]
		h.Encode(b[wire.EthSize:])
		e.xmit(ch.peer.MAC, b)
		ch.probeAt = now.Add(ch.curRTO())
		due(ch.probeAt)
	}
	if ka := e.cfg.KeepAlive; ka > 0 && len(ch.inflight) == 0 && !ch.hasWork() {
		if now.Sub(ch.heard) >= e.cfg.PeerTimeout {
			ch.fail(fmt.Errorf("%w: nothing from %v for %v on an idle channel", ErrTimeout, ch.peer, e.cfg.PeerTimeout))
			return timeNever, timeNever
		}
		if !now.Before(ch.heard.Add(ka)) && !now.Before(ch.keepAt) {
			h := wire.Header{Type: wire.TypeAck, Flags: wire.FlagAckNow, Dst: ch.peer.EP, Src: ch.ep.id,
				Session: ch.session, Ack: ch.rcvNext, Sack: ch.sack(), Window: ch.window()}
			b := e.scratch[:wire.EthSize+wire.Size]
			h.Encode(b[wire.EthSize:])
			e.xmit(ch.peer.MAC, b)
			ch.keepAt = now.Add(ka)
		}
		due(ch.heard.Add(ka))
		due(ch.keepAt)
		due(ch.heard.Add(e.cfg.PeerTimeout))
	}
	return next, retx
}

// fail ends the channel: every request that depends on it ends with err,
// its buffers return to the pools.
func (ch *channel) fail(err error) {
	if ch.state == stateDead {
		return
	}
	e := ch.ep.e
	ch.state = stateDead
	ch.err = err
	ch.stopAckTimer()
	if ch.connWait != nil {
		close(ch.connWait)
		ch.connWait = nil
	}
	for _, f := range ch.inflight {
		e.tx.put(f.buf)
	}
	ch.inflight = nil
	for _, it := range ch.queue {
		if it.req != nil {
			it.req.finish(err)
		}
	}
	ch.queue, ch.ctl = nil, nil
	for _, r := range ch.rndv {
		r.finish(err)
	}
	for _, m := range ch.rxMsgs {
		if m.req != nil {
			m.req.finish(err)
		}
	}
	for _, m := range ch.pulls {
		m.req.finish(err)
	}
	for _, f := range ch.ooo {
		e.rx.put(f.buf)
	}
	ep := ch.ep
	kept := ep.unexpected[:0]
	for _, m := range ep.unexpected {
		if m.ch != ch {
			kept = append(kept, m)
			continue
		}
		// A complete message stays receivable; a partial one never
		// completes now.
		if !m.rts && m.got == m.length {
			kept = append(kept, m)
			continue
		}
		for _, f := range m.frames {
			e.rx.put(f)
		}
	}
	ep.unexpected = kept
	ep.failPosted(ch.peer, err)
	if ep.chans[ch.peer] == ch {
		delete(ep.chans, ch.peer)
		ep.ended[ch.peer] = err
	}
	e.pumpAll()
}
