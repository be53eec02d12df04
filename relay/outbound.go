package relay

// Outbound flow, application to WAN: a stream's out-stage (stage.go).
// Its bytes pass
//
//  1. outStep: the step the poller thread or a worker runs when the
//     application's socket is readable, or a token or credit comes back;
//  2. grant: a pipeline token and credit for the next read;
//  3. the read, into a pooled buffer (pool.go: getBuf);
//  4. forward: the bytes framed as DATA (DATA_AT, with their offset, in a
//     trunk), the burst they belong to counted;
//  5. Trunk.pick (trunk.go): the express link for a message within its
//     budget, else the bulk link with the least queued;
//  6. Link.send (send.go): written at once on an idle link, or queued for
//     the link's writer;
//  7. Link.sent (send.go), once on the socket: the buffer back to the
//     pool, and returnToken gives the stream its token back, which kicks
//     the stage if it waits for one.
//
// WINDOW frames from the peer (recv.go: dispatch) refill the credit
// (addCredit) and kick the stage too.

import (
	"errors"
	"io"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

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
