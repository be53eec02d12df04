package relay

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// TryWriter is implemented by a Conn that can attempt a non-blocking write.
// The link reader then delivers a small payload straight to the
// application when the stream has nothing queued, instead of waking the
// stream's in-stage.
type TryWriter interface {
	TryWrite(p []byte) (int, error)
}

// Stream is one relayed connection on a Link.
type Stream struct {
	l          *Link // home: OPEN and the control frames use it
	id         uint32
	bulkQueued int // frames in the link's bulk queue; guarded by l.mu (lone links only)

	confirmed atomic.Bool // the peer knows the stream: DATA may leave the home link
	// resetOnBreak: the stream's ends carry it on without this gateway
	// pair (ResetOnBreak).
	resetOnBreak atomic.Bool
	used         atomic.Uint64 // bit i: DATA went or came over link i of the trunk

	// The stages (stage.go): out moves application bytes to the link, in
	// moves received bytes to the application.
	out, in stage

	// The out-stage's own state (only its step touches it).
	sendNext uint32     // offset of the next byte sent
	burst    int        // bytes read since the application last paused
	xTokens  int64      // express budget left, bytes
	xAt      time.Time  // when xTokens was last refilled
	w        readWaiter // the application's connection waited for without a goroutine; nil: blocking reads
	// nextN > 0: a token and credit for a read of up to nextN bytes are
	// held. The buffer is taken from the pool only around the read itself,
	// so a quiet stream waiting for its application holds none (a 128 KiB
	// chunk per idle stream otherwise).
	nextN     int
	nextAt    time.Time // when nextN was granted (the burst clock)
	hotErr    error     // a read's end of file or error, left by the poller thread to a goroutine
	streaming bool      // the last read filled its buffer: wait in Go's poller

	// The in-stage's scratch: the payloads of one write and their iovec.
	inBufs []*[]byte
	inIOV  net.Buffers
	// pc: conn forwarded by two-buffer pipelining (pipe.go), whose
	// in-stage keeps the payloads of its started writes here, oldest first.
	pc       PipelinedConn
	started  [pipeDepth]*[]byte
	nStarted int

	mu         sync.Mutex
	conn       Conn
	credit     int64 // bytes we may still send
	free       int   // free pipeline slots (tokens): chunks that may wait for the link
	outWaits   bool  // the out-stage waits for a token or credit: kick it when one comes
	stalled    bool  // the out-stage waits for credit (counted once in WindowStalls)
	recvq      []*[]byte
	recvNext   uint32    // offset of the next byte due in order
	ahead      []segment // DATA_AT received before its turn, by offset
	endAt      uint32    // final offset from a HALF_CLOSE that came early
	haveEnd    bool
	recvAvail  int64 // bytes the peer may still send
	recvEOF    bool
	tw         TryWriter // conn's non-blocking write, if it has one
	delivering bool      // someone (the in-stage or the link reader) is writing to conn
	owed       int64     // credit written to conn but not yet returned
	early      int64     // received bytes counted in the trunk's early (before attach)
	sentFin    bool
	recvDone   bool
	ended      bool
	code       header.Code // why it ended (0: both directions closed cleanly)
	done       chan struct{}
	afterDone  []func() // AfterDone's, run once it has ended
}

// segment is a DATA_AT payload waiting for the bytes before it.
type segment struct {
	off uint32
	p   *[]byte
}

func newStream(l *Link) *Stream {
	s := &Stream{l: l, free: l.cfg.Pipeline,
		credit: int64(l.peer.Window), recvAvail: int64(l.cfg.Window), done: make(chan struct{})}
	s.out.step, s.in.step = s.outStep, s.inStep
	return s
}

// ID is the stream id on its link.
func (s *Stream) ID() uint32 { return s.id }

// Link is the link carrying the stream.
func (s *Stream) Link() *Link { return s.l }

// Done is closed when the stream has ended (cleanly or by a reset).
func (s *Stream) Done() <-chan struct{} { return s.done }

// AfterDone arranges for f to run, on a goroutine of its own, once the
// stream has ended (at once if it has). A caller that only waits for the
// end of a stream to release what it accounted to it holds no goroutine
// while the stream idles.
func (s *Stream) AfterDone(f func()) {
	s.mu.Lock()
	if !s.ended {
		s.afterDone = append(s.afterDone, f)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go f()
}

// runAfterDone starts the AfterDone functions of a stream that has just ended.
func runAfterDone(fs []func()) {
	for _, f := range fs {
		go f()
	}
}

// Code is why the stream ended: 0 when both directions closed cleanly, else
// the reset or refusal code.
func (s *Stream) Code() header.Code {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.code
}

// ErrStreamEnded is returned by Accept on a stream the peer has already
// reset.
var ErrStreamEnded = errors.New("relay: stream already ended")

// Accept completes an incoming stream with the connection to its
// destination: OPEN_OK goes out and bytes start to flow both ways (data the
// peer pipelined behind its OPEN is delivered first). On error the caller
// still owns conn.
func (s *Stream) Accept(conn Conn) error {
	s.mu.Lock()
	ended := s.ended
	s.mu.Unlock()
	if ended {
		return ErrStreamEnded
	}
	s.l.enqueue(frame{h: header.Header{Type: header.TypeOpenOK, Stream: s.id}}, s)
	s.attach(conn)
	return nil
}

// Refuse answers an incoming OPEN with OPEN_REFUSED.
func (s *Stream) Refuse(code header.Code) {
	if s.end(code) {
		f := frame{h: header.Header{Type: header.TypeOpenRefused, Stream: s.id, Length: 4}}
		header.PutU32(f.ctl[:4], uint32(code))
		s.l.enqueue(f, nil)
	}
}

// Reset ends the stream in both directions: RESET goes to the peer and the
// local connection is reset.
func (s *Stream) Reset(code header.Code) {
	if s.end(code) {
		f := frame{h: header.Header{Type: header.TypeReset, Stream: s.id, Length: 4}}
		header.PutU32(f.ctl[:4], uint32(code))
		s.l.enqueue(f, nil)
	}
}

// ResetOnBreak marks a stream whose ends can carry it on without this
// gateway pair (node daemons' resumable connections): a break of a link it
// uses resets it at once, rather than pausing it while the link waits to
// resume, so its ends take another path without waiting for ResumeWithin.
func (s *Stream) ResetOnBreak() { s.resetOnBreak.Store(true) }

// remoteReset ends the stream because the peer (or the link) did.
func (s *Stream) remoteReset(code header.Code) { s.end(code) }

// end marks the stream ended with code and resets the local connection. It
// reports whether this call ended it.
func (s *Stream) end(code header.Code) bool {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return false
	}
	s.ended, s.code = true, code
	after := s.afterDone
	s.afterDone = nil
	conn := s.conn
	w := s.w
	q := s.recvq
	s.recvq = nil
	early := s.early
	s.early = 0
	s.mu.Unlock()
	s.l.t.early.Add(-early)
	close(s.done)
	runAfterDone(after)
	if w != nil {
		w.close() // before the socket closes: its number may be reused
	}
	if conn != nil {
		conn.Abort()
	}
	if conn == nil { // no in-stage owns the queue: recycle it here
		putBufs(q)
	}
	s.mu.Lock()
	for _, g := range s.ahead {
		putBuf(g.p)
	}
	s.ahead = nil
	s.mu.Unlock()
	s.l.t.remove(s)
	return true
}

// maybeFinish closes the stream once both directions are closed.
func (s *Stream) maybeFinish() {
	s.mu.Lock()
	if s.ended || !s.sentFin || !s.recvDone {
		s.mu.Unlock()
		return
	}
	s.ended = true
	after := s.afterDone
	s.afterDone = nil
	conn := s.conn
	w := s.w
	s.mu.Unlock()
	close(s.done)
	runAfterDone(after)
	if w != nil {
		w.close()
	}
	conn.Close()
	s.l.t.remove(s)
}

func (s *Stream) attach(conn Conn) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		conn.Abort()
		return
	}
	s.conn = conn
	s.tw, _ = conn.(TryWriter)
	if s.pc, _ = conn.(PipelinedConn); s.pc != nil {
		s.tw = nil // its in-stage alone writes: it orders the started writes
	}
	if !s.l.cfg.NoPoller {
		if w := newWaiter(conn, &s.out, !s.l.cfg.RuntimeWakes); w != nil {
			s.w = w
		} else if rn, ok := conn.(ReadNotifier); ok {
			s.w = newNotifyWaiter(rn, &s.out)
		}
	}
	early := s.early // from now on the stream's window bounds them
	s.early = 0
	queued := len(s.recvq) > 0 || s.recvEOF
	s.mu.Unlock()
	s.l.t.early.Add(-early)
	s.out.kick()
	if queued {
		s.in.kick()
	}
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Stream) returnToken() {
	if s == nil {
		return // a frame written again after a resume: returned the first time
	}
	s.mu.Lock()
	s.free = min(s.free+1, s.l.cfg.Pipeline)
	wake := s.outWaits
	s.outWaits = false
	s.mu.Unlock()
	if wake {
		s.out.kick()
	}
}

// reserve accounts n received bytes against the window the peer was given.
func (s *Stream) reserve(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recvEOF && !s.haveEnd || int64(n) > s.recvAvail {
		return false
	}
	s.recvAvail -= int64(n)
	return true
}

// unreserve gives back the window of a DATA frame whose payload did not
// arrive whole (its connection broke).
func (s *Stream) unreserve(n int) {
	s.mu.Lock()
	s.recvAvail += int64(n)
	s.mu.Unlock()
}

// errEarly: DATA for a stream not yet connected to its destination would
// pass the trunk's MaxEarly.
var errEarly = errors.New("relay: early data limit")

// pushAt takes a received payload at stream offset off (plain DATA, at
// false: the next offset in order). Payloads ahead of their turn wait in
// s.ahead; the window bounds them, as it bounds the receive queue. An offset
// already delivered, or past a known end, is a protocol error.
func (s *Stream) pushAt(off uint32, at bool, p *[]byte) error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		putBuf(p)
		return nil
	}
	if s.conn == nil {
		// No destination yet: the bytes wait, and all such bytes of the
		// trunk share MaxEarly.
		k := int64(len(*p))
		if !s.l.t.takeEarly(k, s.l.cfg.MaxEarly) {
			s.mu.Unlock()
			putBuf(p)
			return errEarly
		}
		s.early += k
	}
	if !at {
		off = s.recvNext
	}
	n := uint32(len(*p))
	if s.haveEnd && off-s.recvNext+n > s.endAt-s.recvNext {
		s.mu.Unlock()
		putBuf(p)
		return fmt.Errorf("DATA at offset %d+%d beyond its HALF_CLOSE at %d", off, n, s.endAt)
	}
	if off != s.recvNext {
		d := off - s.recvNext // ahead by d bytes (mod 2^32)
		i, found := slices.BinarySearchFunc(s.ahead, d, func(g segment, d uint32) int {
			return cmp.Compare(g.off-s.recvNext, d)
		})
		if d >= 1<<31 || found {
			s.mu.Unlock()
			putBuf(p)
			return fmt.Errorf("DATA at offset %d, which was already received (next %d)", off, s.recvNext)
		}
		s.ahead = slices.Insert(s.ahead, i, segment{off, p})
		s.mu.Unlock()
		return nil
	}
	s.recvNext += n
	if len(s.ahead) > 0 && s.ahead[0].off == s.recvNext {
		// p fills the gap: queue it and everything now in order behind it.
		s.recvq = append(s.recvq, p)
		for len(s.ahead) > 0 && s.ahead[0].off == s.recvNext {
			g := s.ahead[0]
			s.ahead = s.ahead[1:]
			s.recvq = append(s.recvq, g.p)
			s.recvNext += uint32(len(*g.p))
		}
		if len(s.ahead) == 0 {
			s.ahead = nil
		}
		s.checkEnd()
		s.mu.Unlock()
		s.in.kick()
		return nil
	}
	eof := s.checkEnd()
	s.push(p)
	if eof {
		s.in.kick() // the fast path may have delivered p without kicking the in-stage
	}
	return nil
}

// checkEnd turns an early HALF_CLOSE into EOF once every byte before it has
// arrived. Called with s.mu held.
func (s *Stream) checkEnd() bool {
	if s.haveEnd && s.recvNext == s.endAt {
		s.recvEOF = true
	}
	return s.recvEOF
}

// pushEnd is a HALF_CLOSE carrying the final offset: EOF now, or once the
// bytes still on other links have arrived.
func (s *Stream) pushEnd(end uint32) error {
	s.mu.Lock()
	if d := end - s.recvNext; d >= 1<<31 || s.haveEnd {
		s.mu.Unlock()
		return fmt.Errorf("HALF_CLOSE at offset %d, behind the %d bytes received", end, s.recvNext)
	}
	if n := len(s.ahead); n > 0 {
		if last := s.ahead[n-1]; last.off-s.recvNext+uint32(len(*last.p)) > end-s.recvNext {
			s.mu.Unlock()
			return fmt.Errorf("HALF_CLOSE at offset %d, before DATA already received", end)
		}
	}
	s.endAt, s.haveEnd = end, true
	s.checkEnd()
	eof := s.recvEOF
	s.mu.Unlock()
	if eof {
		s.in.kick()
	}
	return nil
}

// push queues p, next in order, for the application. Called with s.mu held;
// returns with it released.
func (s *Stream) push(p *[]byte) {
	if s.tw != nil && len(s.recvq) == 0 && !s.delivering && len(*p) <= s.l.cfg.SmallFrame {
		// Fast path: nothing queued and nobody writing, so order is kept.
		s.delivering = true
		s.mu.Unlock()
		n, err := s.tw.TryWrite(*p)
		s.mu.Lock()
		s.delivering = false
		if err != nil {
			s.mu.Unlock()
			putBuf(p)
			s.Reset(header.CodeAppReset)
			return
		}
		w := s.credited(int64(n))
		if n == len(*p) {
			// In a trunk another link's reader may have queued the next
			// bytes while we wrote; the in-stage waited for us and must be kicked.
			more := len(s.recvq) > 0 || s.recvEOF
			s.mu.Unlock()
			putBuf(p)
			s.sendWindow(w)
			if more {
				s.in.kick()
			}
			return
		}
		// Partial write: queue the rest for the in-stage, ahead of whatever another
		// link's reader queued meanwhile.
		rest := getBuf(len(*p) - n)
		copy(*rest, (*p)[n:])
		putBuf(p)
		s.recvq = slices.Insert(s.recvq, 0, rest)
		s.mu.Unlock()
		s.sendWindow(w)
		s.in.kick()
		return
	}
	s.recvq = append(s.recvq, p)
	s.mu.Unlock()
	s.in.kick()
}

// credited records n bytes written to the application and returns the
// credit to send back now (0: keep batching). Credit goes back in batches
// of Window/8: a sender only stalls once a whole window is unreturned, and
// then owed reaches the threshold as soon as those bytes are written, so
// batching cannot deadlock. After HALF_CLOSE no credit is needed. Called
// with s.mu held.
func (s *Stream) credited(n int64) uint32 {
	s.owed += n
	if s.recvEOF || s.owed < max(int64(s.l.cfg.Window)/8, 1) {
		return 0
	}
	w := s.owed
	s.owed = 0
	s.recvAvail += w // before the WINDOW can reach the peer
	return uint32(w)
}

func (s *Stream) sendWindow(w uint32) {
	if w == 0 {
		return
	}
	f := frame{h: header.Header{Type: header.TypeWindow, Stream: s.id, Length: 4}}
	header.PutU32(f.ctl[:4], w)
	s.l.enqueue(f, nil)
}

func (s *Stream) pushEOF() {
	s.mu.Lock()
	s.recvEOF = true
	s.mu.Unlock()
	s.in.kick()
}

func (s *Stream) addCredit(n int64) {
	s.mu.Lock()
	s.credit += n
	wake := s.outWaits
	s.outWaits = false
	s.mu.Unlock()
	if wake {
		s.out.kick()
	}
}

// expressBudget takes n bytes from the stream's express budget: ExpressMax
// bytes per round trip rtt of the express link (at least ExpressFloor), so
// one message per round trip, a request or a reply, always fits, and a
// stream that sends more is throughput-bound: the bulk links are for it.
func (s *Stream) expressBudget(n int, rtt time.Duration, now time.Time) bool {
	full := int64(s.l.cfg.ExpressMax)
	per := max(rtt, ExpressFloor)
	if d := now.Sub(s.xAt); d >= per {
		s.xTokens = full
	} else {
		s.xTokens = min(full, s.xTokens+full*int64(d)/int64(per))
	}
	s.xAt = now
	if int64(n) > s.xTokens {
		return false
	}
	s.xTokens -= int64(n)
	return true
}

// outStep is the out-stage (stage.go): read at most min(chunk, credit)
// application bytes into a pooled buffer, hand it to the link, and read
// the next while it is written, until it must wait. On the poller thread
// (onPoller) it reads without blocking and sends small frames without
// blocking (sendTry); it leaves to a goroutine a read that fills the
// buffer (the application streams: its next bytes are due at once, and
// waiting in Go's poller costs one wake-up where the poller thread's
// hand-over costs two), end of file and errors.
func (s *Stream) outStep(onPoller bool) waitOn {
	for {
		if s.nextN == 0 {
			if w, ok := s.grant(); !ok {
				return w
			}
		}
		t0 := s.nextAt
		var p *[]byte
		k, err := 0, errWouldBlock
		switch {
		case s.hotErr != nil:
			p = getBuf(s.nextN)
			err, s.hotErr = s.hotErr, nil
		case s.w != nil && (onPoller || !s.streaming):
			p = getBuf(s.nextN)
			k, err = s.w.read(*p)
			if err == errWouldBlock {
				putBuf(p) // nothing to read: wait without a buffer
				if onPoller || s.w.arm() {
					return onReadable
				}
			} else if err != nil && onPoller {
				putBuf(p)
				s.hotErr = err // no bytes come with it
				return onGoroutine
			}
		}
		if err == errWouldBlock {
			if s.w != nil {
				s.w.loud() // Go's poller waits for the socket now
			}
			p = getBuf(s.nextN)
			k, err = s.conn.Read(*p)
		}
		s.nextN = 0
		now := time.Now()
		full := k == len(*p) // p belongs to the link once forwarded
		mode := sendTry
		if pw, ok := s.w.(*waiter); ok && onPoller && pw.p.cork {
			mode = sendCork // the poller's batch goes on: write at its end
		}
		if !onPoller {
			// A read that fills the buffer means the application streams,
			// and it streams on until it pauses (burstGap).
			s.streaming = full || s.streaming && now.Sub(t0) < burstGap
			mode = sendInline
			if s.pc != nil && k > s.l.cfg.SmallFrame {
				// Two-buffer forwarding: the link's writer sends this
				// chunk while the next read fills another (a pipeline
				// token each).
				mode = sendQueue
			}
		}
		if !s.forward(p, k, err, t0, now, mode) {
			if s.w != nil {
				s.w.close() // this direction is over: the socket leaves the poller
			}
			return finished
		}
		if onPoller {
			if full {
				return onGoroutine
			}
			// A read short of the buffer drained the socket: wait for
			// its next bytes without trying another read (the
			// registration is level-triggered), with the next read's
			// token and credit in hand when they are free.
			if w, ok := s.grant(); !ok {
				return w
			}
			return onReadable
		}
	}
}

// grant takes a pipeline token and credit for the next read, or records
// that the out-stage waits for them (ok false, w onSignal), or finds the
// stream ended (w finished).
func (s *Stream) grant() (w waitOn, ok bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return finished, false
	}
	if s.free == 0 || s.credit <= 0 {
		if s.credit <= 0 && !s.stalled {
			s.stalled = true
			s.l.Stats.WindowStalls.Add(1)
		}
		s.outWaits = true
		s.mu.Unlock()
		return onSignal, false
	}
	s.stalled, s.outWaits = false, false
	s.free--
	n := int(min(int64(s.l.chunk), s.credit))
	s.mu.Unlock()
	s.nextN, s.nextAt = n, time.Now()
	return 0, true
}

// forward sends what a read returned (k bytes into p, then err) and reports
// whether the stream goes on reading. now is when the read returned; t0
// when the reader began to wait: a wait longer than burstGap means the
// application paused, so a new message begins.
func (s *Stream) forward(p *[]byte, k int, err error, t0, now time.Time, mode sendMode) bool {
	l := s.l
	if now.Sub(t0) > burstGap {
		s.burst = 0
	}
	if k > 0 {
		s.mu.Lock()
		s.credit -= int64(k)
		s.mu.Unlock()
		*p = (*p)[:k]
		f := frame{h: header.Header{Type: header.TypeData, Stream: s.id, Length: uint32(k)}, body: *p, buf: p, s: s}
		out := l
		if l.t.lanes {
			f.h.Type, f.h.Length = header.TypeDataAt, uint32(header.DataAtPrefix+k)
			header.PutU32(f.ctl[:4], s.sendNext)
			s.burst += k
			out = l.t.pick(s, k, now)
			s.used.Or(1 << out.index)
		}
		s.sendNext += uint32(k)
		if !out.send(f, s, mode) {
			putBuf(p)
			if out != l { // that link just failed, and resets this stream
				s.Reset(header.CodeLinkLost)
			}
			return false
		}
	} else {
		putBuf(p)
		s.returnToken()
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			f := frame{h: header.Header{Type: header.TypeHalfClose, Stream: s.id}}
			if l.t.lanes { // bytes may still be on other links: say where the end is
				f.h.Length = 4
				header.PutU32(f.ctl[:4], s.sendNext)
			}
			l.send(f, s, mode)
			s.mu.Lock()
			s.sentFin = true
			s.mu.Unlock()
			s.maybeFinish()
		} else {
			s.Reset(header.CodeAppReset) // no-op when the stream ended first
		}
		return false
	}
	return true
}

// inEnd ends the in-stage once the peer's end of stream and every byte
// before it are delivered: the application reads end of file.
func (s *Stream) inEnd(conn Conn) waitOn {
	conn.CloseWrite()
	s.mu.Lock()
	s.recvDone = true
	s.mu.Unlock()
	s.maybeFinish()
	return finished
}

// inStep is the in-stage (stage.go): it delivers received payloads to
// the application, several per writev, and returns their credit to the
// peer once written. It runs on a goroutine only (its writes block while
// the application does not read).
func (s *Stream) inStep(bool) waitOn {
	for {
		s.mu.Lock()
		if s.ended {
			s.mu.Unlock()
			return finished
		}
		conn := s.conn
		if conn == nil || s.delivering || len(s.recvq) == 0 && !s.recvEOF {
			// Before attach, or the link reader is writing (it kicks the
			// stage if more is queued once it is done), or nothing queued.
			s.mu.Unlock()
			return onSignal
		}
		if pc := s.pc; pc != nil {
			s.mu.Unlock()
			return s.inStepPiped(pc)
		}
		bufs := append(s.inBufs[:0], s.recvq...)
		clear(s.recvq)
		s.recvq = s.recvq[:0]
		if len(bufs) == 0 { // EOF with everything delivered
			s.mu.Unlock()
			return s.inEnd(conn)
		}
		s.delivering = true
		s.mu.Unlock()

		var total int64
		var err error
		if bw, ok := conn.(BuffersWriter); ok && len(bufs) > 1 {
			iov := s.inIOV[:0]
			for _, p := range bufs {
				iov = append(iov, *p)
			}
			s.inIOV = iov
			total, err = bw.WriteBuffers(&iov)
		} else {
			for _, p := range bufs {
				var n int
				n, err = conn.Write(*p)
				total += int64(n)
				if err != nil {
					break
				}
			}
		}
		putBufs(bufs)
		clear(s.inIOV)
		s.inBufs = bufs[:0]
		s.mu.Lock()
		s.delivering = false
		w := s.credited(total)
		s.mu.Unlock()
		if err != nil {
			s.Reset(header.CodeAppReset)
			return finished
		}
		s.sendWindow(w)
	}
}
