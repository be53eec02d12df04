package relay

// Inbound flow, WAN to application: a stream's receive side and its
// in-stage (stage.go). A DATA frame's payload passes
//
//  1. the link's reader (recv.go: recvData), which checks it against the
//     window the peer was given (reserve) and reads it straight into a
//     pooled buffer (pool.go);
//  2. pushAt: next in order, or held in ahead until the bytes before it
//     have come over other links (DATA_AT); pushEnd and pushEOF for a
//     HALF_CLOSE;
//  3. push: written to the application at once when it is small and
//     nothing waits (TryWrite), else queued and the in-stage kicked;
//  4. inStep: the queue written to the application, several payloads per
//     writev (a PipelinedConn's: inStepPiped, pipe.go), the buffers back
//     to the pool;
//  5. credited, sendWindow: the credit back to the peer in WINDOW frames
//     once the bytes are written, in batches of Window/8;
//  6. inEnd: end of file for the application, once every byte before
//     the HALF_CLOSE is delivered.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/mpi5k/mpi5k/header"
)

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

func (s *Stream) pushEOF() {
	s.mu.Lock()
	s.recvEOF = true
	s.mu.Unlock()
	s.in.kick()
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
