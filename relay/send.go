package relay

// The write side of a link. A frame passes
//
//  1. send (enqueue: queue only), the one way in, with the mode that says
//     who may write it (sendMode);
//  2. idleFor: on an idle link its caller writes it: writeNow (sendInline,
//     sendTry), or corkNow and, after the poller thread's batch,
//     flushCork (sendCork: the batch's small frames in one writev);
//  3. queue, otherwise: the urgent queue (control frames, small DATA) or
//     the bulk queue, for the writer goroutine;
//  4. writeLoop: take (every urgent frame, then about one chunk of bulk),
//     each frame encoded by appendIOV, the batch written with one writev;
//  5. sent, once the frame is on the socket: the counters, the payload's
//     buffer back to the pool, the stream's token (returnToken,
//     outbound.go).
//
// Hold, Pad and WatchSend are what package tuning drives from outside.

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// frame is one queued outgoing frame.
type frame struct {
	h       header.Header
	ctl     [8]byte // u32 and PING/PONG bodies; DATA_AT's offset
	body    []byte  // DATA payload or OPEN body (else ctl[:h.Length])
	buf     *[]byte // pooled DATA buffer, released once written
	s       *Stream // owner of DATA: gets its token back once written
	counted bool    // counted in s.bulkQueued (a lone link's ordering rule)
	skip    int     // leading bytes already written (the rest of a partial write)
	done    chan struct{}
	// WAN resume (resume.go): the frame's first byte in the link, and
	// whether it is written again after a resume (its bookkeeping was
	// done the first time).
	seq      uint64
	replayed bool
	kept     bool // on the replay list (from before its first byte is written)
}

func (f *frame) isData() bool { return f.h.Type == header.TypeData || f.h.Type == header.TypeDataAt }

// dataLen is the application bytes a DATA or DATA_AT frame carries.
func (f *frame) dataLen() int {
	if f.h.Type == header.TypeDataAt {
		return int(f.h.Length) - header.DataAtPrefix
	}
	return int(f.h.Length)
}

// appendIOV appends f's header (encoded into hb) and payload to iov,
// less the f.skip bytes already written.
func (f *frame) appendIOV(iov net.Buffers, hb []byte) net.Buffers {
	f.h.Encode(hb)
	parts := [3][]byte{hb}
	n := 1
	if f.h.Type == header.TypeDataAt {
		parts[n] = f.ctl[:header.DataAtPrefix]
		n++
	}
	if f.h.Length > 0 {
		parts[n] = f.payload()
		n++
	}
	skip := f.skip
	for _, b := range parts[:n] {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		iov = append(iov, b[skip:])
		skip = 0
	}
	return iov
}

// inlineWrite is what send's inline write needs beside the frame's bytes.
type inlineWrite struct {
	f    frame
	hb   [header.Size]byte
	a    [3][]byte
	bufs net.Buffers // what WriteTo consumes (a local would escape to the heap)
}

// wireLen is the frame's size on the wire.
func (f *frame) wireLen() int { return header.Size + int(f.h.Length) }

// enqueue schedules f. Control frames go to the urgent queue; DATA of more
// than SmallFrame bytes goes to the bulk queue, and so does every later frame
// of a stream while it has bulk frames waiting, so a stream's bytes and its
// HALF_CLOSE never overtake each other.
func (l *Link) enqueue(f frame, s *Stream) bool { return l.send(f, s, sendQueue) }

// How send may write a frame itself, which depends on who calls it:
//
//   - sendQueue: never. The link's reader (and anyone who may not block,
//     or holds a lock) only queues: a reader blocked on a write could
//     deadlock two gateways, each waiting for the other to read.
//   - sendInline: on an idle link, with a blocking write. A stream's
//     out-stage on a worker goroutine: it saves the hand-off to the writer
//     goroutine, a thread wake-up of several microseconds, which is latency
//     on the small-message path and, for a bulk stream on an idle link
//     (one wake-up per chunk), cost the sending gateway 8-23 % of its
//     forwarding rate per CPU-second (medians of BenchmarkForward,
//     bench/figures/forwarding).
//   - sendTry: on an idle link, small frames only, without blocking. The
//     poller thread, which serves every socket of the process and so must
//     never block: what the socket does not take at once goes to the writer.
//   - sendCork: sendTry deferred to the end of the poller thread's batch of
//     readiness events (corkFor): the frames its steps send on one link
//     in one batch go out in one writev.
//
// The modes are one path (send) with the write-now case first.
type sendMode int

const (
	sendQueue sendMode = iota
	sendInline
	sendTry
	sendCork
)

// send writes f now if the link is idle and mode allows it (writeNow),
// and otherwise queues it for the writer goroutine.
func (l *Link) send(f frame, s *Stream, mode sendMode) bool {
	l.mu.Lock()
	if l.retired {
		if f.h.Type == header.TypeAck {
			// This link's count, not its successor's: a retired link is
			// never resumed, so nobody needs it.
			l.mu.Unlock()
			return true
		}
		// Whoever picked this link before its successor took over.
		succ := l.succ
		l.mu.Unlock()
		return succ.send(f, s, mode)
	}
	if l.closed {
		l.mu.Unlock()
		return false
	}
	if f.isData() {
		l.queued.Add(int64(f.dataLen()))
	}
	if mode == sendCork {
		if l.corkMore(&f) {
			l.cork = append(l.cork, f)
			l.mu.Unlock()
			return true
		}
		if l.sealed != nil {
			mode = sendTry // a record per frame either way
		}
	}
	if l.idleFor(&f, mode) {
		if mode == sendCork {
			return l.corkNow(f)
		}
		return l.writeNow(f, mode)
	}
	return l.queue(f, s)
}

// idleFor reports whether the caller may write f itself (mode): nobody
// writes or waits to, and nothing holds the link back. Under l.mu.
func (l *Link) idleFor(f *frame, mode sendMode) bool {
	switch mode {
	case sendQueue:
		return false
	case sendTry, sendCork:
		if l.w == nil || int(f.h.Length) > l.cfg.SmallFrame {
			return false // no raw socket to try; a large frame would not go at once
		}
	}
	return !l.writing && !l.broken && !l.tail && l.ui == len(l.urgent) && l.bi == len(l.bulk) && !l.held() && l.replayRoom()
}

// writeNow writes f on the caller's thread (send's fast path). Called with
// l.mu held; it takes the socket (l.writing) and releases the lock.
func (l *Link) writeNow(f frame, mode sendMode) bool {
	l.writing = true
	conn, w, gen := l.conn, l.w, l.gen
	l.mu.Unlock()
	// The inline writer's frame, header and iovec live in the link
	// (l.writing makes them its own): on the stack they would escape
	// into the write and cost four allocations per small frame.
	iw := &l.inline
	if l.rs != nil {
		l.keep(&f)
	}
	iw.f = f
	iov := iw.f.appendIOV(iw.a[:0], iw.hb[:])
	var err error
	tail := false // part of a sealed record waits in the SealedConn
	if mode == sendTry {
		var n int
		if sc, ok := conn.(*SealedConn); ok {
			// The record carries the whole frame: what the socket
			// did not take is the record's, not the frame's.
			tail, err = sc.tryWritev(iov, w.writev)
			n = f.wireLen()
			if tail {
				l.Stats.PollPartial.Add(1)
			}
		} else {
			n, err = w.writev(iov)
		}
		l.Stats.PollSent.Add(1)
		if err == nil && n < f.wireLen() {
			l.Stats.PollPartial.Add(1)
			// The socket took part of the frame, or none of it: the
			// writer sends the rest before anything else.
			f.skip = n
			*iw = inlineWrite{}
			l.mu.Lock()
			l.writing = false
			if !l.closed {
				if !f.isData() {
					l.ctlQueued++
				}
				l.urgent = slices.Insert(l.urgent, l.ui, f)
				l.mu.Unlock()
				kick(l.wake)
				return true
			}
			l.mu.Unlock()
			l.sent(&f) // the link failed meanwhile
			return true
		}
	} else {
		iw.bufs = iov
		err = writeBatch(conn, &iw.bufs)
		l.Stats.InlineSent.Add(1)
	}
	*iw = inlineWrite{} // pins no payload
	l.Stats.Writes.Add(1)
	l.sent(&f)
	l.mu.Lock()
	l.writing = false
	l.tail = l.tail || tail
	// A link retiring meanwhile waits for its writer to send RETIRE.
	pending := l.ui < len(l.urgent) || l.bi < len(l.bulk) || l.succ != nil || tail
	l.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("relay: write to %v: %w", l.remoteAddr(), err)
		if mode == sendTry {
			go l.broke(gen, err) // fail runs callbacks; never on the poller thread
		} else {
			l.broke(gen, err)
		}
	} else if pending {
		kick(l.wake)
	}
	return true
}

// Corking: the poller thread often finds several sockets readable at once
// (one epoll_wait, several streams' messages), and each step's sendTry
// would write its frame with a writev of its own: one system call, one
// TCP segment and one wake-up of the peer's reader per message. Within
// such a batch the first frame for an idle link takes the socket
// (l.writing) and the link's later frames join it (l.cork) as long as
// nothing else waits to be written; the poller writes each corked link's
// frames with one non-blocking writev once the batch's steps have run
// (flushCork). The wait is the rest of the batch, a few microseconds per
// step; a lone event sends at once, as before. Figures:
// bench/figures/permessage.

// corkMore reports whether f may join the frames corked on l: they hold
// the socket, nothing was queued behind them, f is small, and what lets an
// idle link be written at once (idleFor) still holds. Under l.mu.
func (l *Link) corkMore(f *frame) bool {
	return l.corked && !l.broken && l.ui == len(l.urgent) && l.bi == len(l.bulk) &&
		len(l.cork) < l.cfg.MaxBatch && int(f.h.Length) <= l.cfg.SmallFrame &&
		!l.held() && l.replayRoom()
}

// corkNow takes the socket for the poller's batch with f as its first
// frame. Called with l.mu held; releases it.
func (l *Link) corkNow(f frame) bool {
	l.writing, l.corked = true, true
	l.cork = append(l.cork[:0], f)
	l.mu.Unlock()
	p := l.w.p
	p.corks = append(p.corks, l)
	return true
}

// flushCork writes the frames corked on l with one non-blocking writev
// (the poller thread, after its batch). What the socket does not take goes
// to the front of the urgent queue, for the writer.
func (l *Link) flushCork() {
	l.mu.Lock()
	l.corked = false
	batch, w, gen := l.cork, l.w, l.gen
	l.mu.Unlock()
	if l.corkIOV == nil {
		l.corkIOV = make(net.Buffers, 0, 3*l.cfg.MaxBatch)
		l.corkHdrs = make([]byte, header.Size*l.cfg.MaxBatch)
	}
	iov := l.corkIOV[:0]
	for i := range batch {
		if l.rs != nil {
			l.keep(&batch[i])
		}
		iov = batch[i].appendIOV(iov, l.corkHdrs[i*header.Size:(i+1)*header.Size])
	}
	n, err := w.writev(iov)
	clear(iov)
	l.Stats.Writes.Add(1)
	l.Stats.PollSent.Add(uint64(len(batch)))
	k := 0
	for ; k < len(batch) && (err != nil || n >= batch[k].wireLen()); k++ {
		if err == nil {
			n -= batch[k].wireLen()
		}
		l.sent(&batch[k]) // on an error too, as writeNow does
	}
	l.mu.Lock()
	if k < len(batch) {
		// The socket took part of the frames: the writer sends the rest
		// before anything queued behind them.
		l.Stats.PollPartial.Add(1)
		batch[k].skip = n
		for _, f := range batch[k:] {
			if !f.isData() {
				l.ctlQueued++
			}
		}
		l.urgent = slices.Insert(l.urgent, l.ui, batch[k:]...)
	}
	l.writing = false
	pending := l.ui < len(l.urgent) || l.bi < len(l.bulk) || l.succ != nil
	l.mu.Unlock()
	clear(batch) // pins no payload
	l.cork = batch[:0]
	if err != nil {
		go l.broke(gen, fmt.Errorf("relay: write to %v: %w", l.remoteAddr(), err)) // never fail on the poller thread
	} else if pending {
		kick(l.wake)
	}
}

// queue puts f on its queue for the writer goroutine. Called with l.mu
// held; releases it.
func (l *Link) queue(f frame, s *Stream) bool {
	// In a trunk, offsets restore a stream's order, so only size decides.
	// Filler waits behind everything.
	bulk := f.isData() && f.dataLen() > l.cfg.SmallFrame || f.h.Type == header.TypePad
	if !l.t.lanes && s != nil && s.bulkQueued > 0 {
		bulk = true
	}
	if bulk {
		if !l.t.lanes && s != nil {
			f.s, f.counted = s, true // take decrements its bulkQueued
			s.bulkQueued++
		}
		l.bulk = append(l.bulk, f)
	} else {
		if !f.isData() {
			if l.ctlQueued >= l.cfg.MaxControl {
				return l.overflowed()
			}
			l.ctlQueued++
		}
		l.urgent = append(l.urgent, f)
	}
	idle := !l.writing
	l.mu.Unlock()
	if idle {
		kick(l.wake)
	}
	return true
}

// overflowed drops a control frame that would pass MaxControl and fails
// the link, once. Called with l.mu held; returns with it released. The
// frame is not queued, so send reports false.
func (l *Link) overflowed() bool {
	first := !l.overflow
	l.overflow = true
	n := l.ctlQueued
	l.mu.Unlock()
	if first {
		err := fmt.Errorf("relay: peer %s (%v) leaves %d control frames unread (limit %d): it sends requests (PING, OPEN, DATA) faster than it reads the replies",
			l.peer.Name, l.remoteAddr(), n, l.cfg.MaxControl)
		go func() { // never fail on the poller thread
			l.limited("control_queue", err)
			l.fail(err)
		}()
	}
	return false
}

func (f *frame) payload() []byte {
	if f.body != nil {
		return f.body
	}
	return f.ctl[:f.h.Length]
}

// sent does the bookkeeping once f is on the socket (or the link failed).
// A resuming link's replay list owns the payload (keep).
func (l *Link) sent(f *frame) {
	if f.replayed {
		return // counted when first written
	}
	if f.kept {
		f.buf = nil
	}
	l.Stats.FramesSent.Add(1)
	if !keepalive(f.h.Type) {
		l.active.Add(1)
	}
	if f.isData() || f.h.Type == header.TypePad {
		l.notifySent()
	}
	if f.isData() {
		n := f.dataLen()
		l.queued.Add(-int64(n))
		l.Stats.BytesSent.Add(uint64(n))
		putBuf(f.buf)
		f.s.returnToken()
	}
	if f.h.Type == header.TypePad {
		l.Stats.PadSent.Add(uint64(f.h.Length))
	}
	if f.done != nil {
		close(f.done)
	}
}

// padZeros is the payload of every PAD frame (never written to, so it
// costs no memory).
var padZeros [header.MaxPayload]byte

// ErrNoPad: the peer did not say it discards PAD frames (HELLO feature PAD).
var ErrNoPad = errors.New("relay: the peer does not take PAD frames")

// Pad writes one PAD frame of n filler bytes (at most one chunk: it
// returns how many) behind everything queued, as bulk, and returns once it
// is on the socket, or with the link's error if the link closes first.
// Small frames sent meanwhile go ahead of it. A gateway pads a new link to
// let its congestion control measure the path (tuning.Prime).
func (l *Link) Pad(n int) (int, error) {
	if l.peer.Features&header.FeaturePad == 0 {
		return 0, ErrNoPad
	}
	n = max(0, min(n, l.chunk))
	f := frame{h: header.Header{Type: header.TypePad, Length: uint32(n)}, body: padZeros[:n], done: make(chan struct{})}
	if !l.enqueue(f, nil) {
		return 0, l.closedErr()
	}
	select {
	case <-f.done:
		return n, nil
	case <-l.done:
		return 0, l.closedErr()
	}
}

// take moves the next batch into batch: every urgent frame first, then bulk
// frames up to about one chunk so a small frame arriving now waits behind at
// most one chunk in user space.
func (l *Link) take(batch []frame) []frame {
	for l.ui < len(l.urgent) && len(batch) < l.cfg.MaxBatch {
		if !l.urgent[l.ui].isData() {
			l.ctlQueued--
		}
		batch = append(batch, l.urgent[l.ui])
		l.urgent[l.ui] = frame{}
		l.ui++
	}
	if l.ui == len(l.urgent) {
		l.urgent, l.ui = l.urgent[:0], 0
	}
	n := 0
	for l.bi < len(l.bulk) && len(batch) < l.cfg.MaxBatch && (n == 0 || n+int(l.bulk[l.bi].h.Length) <= l.chunk) && l.replayRoom() {
		f := l.bulk[l.bi]
		l.bulk[l.bi] = frame{}
		l.bi++
		if f.counted {
			f.s.bulkQueued--
		}
		n += int(f.h.Length)
		batch = append(batch, f)
	}
	if l.bi == len(l.bulk) {
		l.bulk, l.bi = l.bulk[:0], 0
	}
	return batch
}

// writeLoop owns the socket whenever the queues are non-empty and no
// inline writer holds it (l.writing), and writes them in batches.
func (l *Link) writeLoop() {
	batch := make([]frame, 0, l.cfg.MaxBatch)
	hdrs := make([]byte, header.Size*l.cfg.MaxBatch)
	iov := make(net.Buffers, 0, 3*l.cfg.MaxBatch)
	hold := time.NewTimer(0)
	defer hold.Stop()
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return
		}
		if l.succ != nil && !l.writing && l.ui == len(l.urgent) && l.bi == len(l.bulk) {
			l.writeRetire(hdrs[:header.Size])
			return
		}
		if l.writing || l.broken || l.ui == len(l.urgent) && (l.bi == len(l.bulk) || !l.replayRoom()) && !l.tail {
			l.mu.Unlock()
			select {
			case <-l.wake:
			case <-l.done:
			}
			l.mu.Lock()
			continue
		}
		if d := l.holdLeft(); d > 0 {
			l.mu.Unlock()
			hold.Reset(d)
			select {
			case <-hold.C:
			case <-l.done:
			}
			l.mu.Lock()
			continue
		}
		l.writing = true
		l.tail = false // writeBatch sends it first
		conn, gen := l.conn, l.gen
		batch = l.take(batch[:0])
		l.mu.Unlock()

		iov = iov[:0]
		for i := range batch {
			if l.rs != nil {
				l.keep(&batch[i])
			}
			iov = batch[i].appendIOV(iov, hdrs[i*header.Size:(i+1)*header.Size])
		}
		// WriteTo consumes its receiver; keep iov's backing array for reuse.
		w := iov
		err := writeBatch(conn, &w)
		l.Stats.Writes.Add(1)
		for i := range batch {
			l.sent(&batch[i])
			batch[i] = frame{}
		}
		if err != nil {
			l.mu.Lock()
			l.writing = false
			l.mu.Unlock()
			l.broke(gen, fmt.Errorf("relay: write to %v: %w", l.remoteAddr(), err))
			l.mu.Lock()
			continue
		}
		l.mu.Lock()
		l.writing = false
	}
}

// MaxHold is the longest a Hold lasts: well under any DeadAfter, so a
// held link never looks dead to its peer.
const MaxHold = time.Second

// SendWatchSlots is how many watches (WatchSend) a link keeps at once, one
// per watcher: the gateway's PROBE_RTT guard and its WAN sampler.
const SendWatchSlots = 2

// WatchSend arms a one-shot signal in slot: the next DATA or PAD frame the
// link sends after the call makes a non-blocking send on c. A sampler that
// has seen the link quiet (nothing sent, nothing in flight) can then sleep
// until it carries bytes again instead of polling it; keepalives and other
// control frames do not wake it. A later call for the same slot replaces
// its watch; the slots are independent.
func (l *Link) WatchSend(slot int, c chan<- struct{}) { l.sendWatch[slot].Store(&c) }

func (l *Link) notifySent() {
	for i := range l.sendWatch {
		w := &l.sendWatch[i]
		if w.Load() == nil {
			continue
		}
		if c := w.Swap(nil); c != nil {
			select {
			case *c <- struct{}{}:
			default:
			}
		}
	}
}

// Hold stops writing to the link's socket until the time until: frames
// queue meanwhile and go out in order when it ends. The gateway uses it to
// let a BBR socket go idle across the expiry of its min_rtt filter, which
// then restarts from idle instead of dipping into PROBE_RTT. Keep holds
// short: keepalives wait too, so a hold is cut to MaxHold.
func (l *Link) Hold(until time.Time) {
	if m := time.Now().Add(MaxHold); until.After(m) {
		until = m
	}
	l.holdUntil.Store(until.UnixNano())
	kick(l.wake) // the writer re-reads the hold before its next batch
}

// held reports whether a hold is in force, clearing one that has ended.
func (l *Link) held() bool { return l.holdLeft() > 0 }

// holdLeft is how long the current hold still runs (<= 0: none).
func (l *Link) holdLeft() time.Duration {
	h := l.holdUntil.Load()
	if h == 0 {
		return 0
	}
	d := time.Duration(h - time.Now().UnixNano())
	if d <= 0 {
		l.holdUntil.CompareAndSwap(h, 0)
	}
	return d
}
