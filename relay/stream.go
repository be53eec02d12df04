package relay

// A stream's life; its bytes pass the stages of outbound.go and
// inbound.go. A stream is
//
//  1. made: newStream, by Link.Open on the opening side (link.go) or by
//     the reader's OPEN on the other (recv.go: dispatch), and registered
//     in the trunk (trunk.go: register);
//  2. attached: attach joins the application's connection (Link.Open;
//     Accept, once the peer's side has connected its destination) and
//     kicks both stages;
//  3. carried: outStep (outbound.go) and inStep (inbound.go) run until
//     each direction has ended;
//  4. ended: end (Reset, Refuse, the peer's RESET, a lost link) or
//     maybeFinish (both directions closed): Done closes, AfterDone's
//     functions run, and the trunk forgets the stream (remove).

import (
	"errors"
	"net"
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
