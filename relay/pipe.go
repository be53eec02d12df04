package relay

// Two-buffer forwarding to a PipelinedConn. A payload passes
//
//  1. push (inbound.go): queued, never written by the link's reader;
//  2. inStepPiped: StartWrite, with at most pipeDepth writes started;
//  3. finishWrite: FinishWrite waits for the oldest write; its buffer goes
//     back to the pool and its credit to the peer (credited, sendWindow).
//
// Outbound, the out-stage hands each bulk chunk to the link's writer
// (sendQueue, outbound.go) and reads the next while it is written.

import "github.com/mpi5k/mpi5k/header"

// PipelinedConn is a Conn forwarded by pipelined two-buffer forwarding
// (doc.go, "Two-buffer forwarding"): a connection that is not a kernel
// socket (an MX stream) and can send a buffer without copying it. The
// in-stage starts writing one received payload while the link reader
// fills the next, and keeps at most two started; the out-stage hands a
// bulk chunk to the link's writer and reads the next while it is written.
type PipelinedConn interface {
	Conn
	// StartWrite begins sending p and returns once it is handed on (it
	// may wait for the far end's window); p stays unchanged, and the
	// relay's, until the FinishWrite that ends it has returned.
	StartWrite(p []byte) error
	// FinishWrite waits until the oldest started write no longer needs
	// its buffer. An error (the connection failed or was aborted) leaves
	// the buffers of the writes still started to their sender, which
	// may yet read them: the relay drops them rather than reuse them.
	FinishWrite() error
}

// pipeDepth is how many payloads the in-stage of a PipelinedConn keeps
// started: one being sent while the next is handed on.
const pipeDepth = 2

// inStepPiped is the in-stage (stage.go) of a PipelinedConn: it starts
// writing each received payload, in order, with at most pipeDepth started,
// and returns a payload's credit to the peer once its write has finished.
// It never waits for a signal with writes started: it finishes them
// first, while the link reader queues what comes next.
func (s *Stream) inStepPiped(pc PipelinedConn) waitOn {
	for {
		s.mu.Lock()
		if s.ended {
			s.mu.Unlock()
			s.dropStarted()
			return finished
		}
		if len(s.recvq) == 0 {
			eof := s.recvEOF
			s.mu.Unlock()
			if s.nStarted > 0 {
				if !s.finishWrite(pc) {
					return finished
				}
				continue
			}
			if !eof {
				return onSignal
			}
			return s.inEnd(pc)
		}
		bufs := append(s.inBufs[:0], s.recvq...)
		clear(s.recvq)
		s.recvq = s.recvq[:0]
		s.mu.Unlock()
		for i, p := range bufs {
			bufs[i] = nil
			if s.nStarted == pipeDepth && !s.finishWrite(pc) {
				putBuf(p)
				putBufs(bufs[i+1:])
				return finished
			}
			if err := pc.StartWrite(*p); err != nil {
				// Part of p may be on its way: p is dropped, not reused.
				putBufs(bufs[i+1:])
				s.dropStarted()
				s.Reset(header.CodeAppReset)
				return finished
			}
			s.started[s.nStarted] = p
			s.nStarted++
		}
		s.inBufs = bufs[:0]
	}
}

// finishWrite waits for the oldest started write, recycles its buffer and
// credits its bytes. False: the connection failed and the stream is reset.
func (s *Stream) finishWrite(pc PipelinedConn) bool {
	if err := pc.FinishWrite(); err != nil {
		s.dropStarted()
		s.Reset(header.CodeAppReset)
		return false
	}
	p := s.started[0]
	copy(s.started[:], s.started[1:s.nStarted])
	s.nStarted--
	s.started[s.nStarted] = nil
	n := int64(len(*p))
	putBuf(p)
	s.mu.Lock()
	w := s.credited(n)
	s.mu.Unlock()
	s.sendWindow(w)
	return true
}

// dropStarted forgets the buffers of writes still started: their sender
// may still read them, so they go to the garbage collector, not the pool.
func (s *Stream) dropStarted() {
	clear(s.started[:])
	s.nStarted = 0
}
