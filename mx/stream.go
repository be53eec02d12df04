package mx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Streams carry a byte stream over MX messages between two endpoints, for
// the gateway and the ranks, which speak byte streams. Each stream is a
// 47-bit id chosen by the dialer; its messages use the match bits
//
//	63..56 streamClass | 55..9 id | 8 sent by the dialer | 7..0 kind
//
// A data message carries bytes (an empty one is the end of the stream); a
// credit message returns receive window (u32 bytes read); reset aborts the
// stream; open announces it to the listener with the dialer's metadata.
const (
	streamClass = 0x5a
	kindData    = 0
	kindCredit  = 1
	kindReset   = 2
	kindOpen    = 3
	kindMask    = 0xff
	dialerBit   = 1 << 8
	idShift     = 9
	maxStreamID = 1<<47 - 1
)

func streamMatch(id uint64, fromDialer bool, kind uint64) uint64 {
	m := uint64(streamClass)<<56 | id<<idShift | kind
	if fromDialer {
		m |= dialerBit
	}
	return m
}

// StreamConfig sizes streams. Zero fields take defaults.
type StreamConfig struct {
	// Chunk is the largest message a Write sends (default 64 KiB);
	// Window the bytes a writer may have unread at the reader (default
	// 512 KiB): the reader's memory per stream.
	Chunk, Window int
	// RecvAhead is how many receives a stream keeps posted (default 1,
	// at most 4): with two, the next message is pulled into one buffer
	// while the last is read from the other (a forwarder's two-buffer
	// pipelining), instead of after the reader has taken it.
	RecvAhead int
}

func (c *StreamConfig) fill() error {
	if c.Chunk == 0 {
		c.Chunk = 64 << 10
	}
	if c.Window == 0 {
		c.Window = 512 << 10
	}
	if c.RecvAhead == 0 {
		c.RecvAhead = 1
	}
	if c.Chunk < 1 || c.Window < c.Chunk {
		return fmt.Errorf("mx: stream chunk %d and window %d: need 0 < chunk <= window", c.Chunk, c.Window)
	}
	if c.RecvAhead < 1 || c.RecvAhead > maxRecvAhead {
		return fmt.Errorf("mx: stream receives ahead %d out of range 1..%d", c.RecvAhead, maxRecvAhead)
	}
	return nil
}

// ErrReset is what Read and Write return after the peer aborted the stream.
var ErrReset = errors.New("mx: stream reset by peer")

// Stream is one byte stream; it implements io.ReadWriteCloser plus
// CloseWrite (end of stream toward the peer) and Abort (reset).
type Stream struct {
	ep     *Endpoint
	peer   Addr
	id     uint64
	dialer bool
	cfg    StreamConfig
	Meta   []byte // what the dialer sent with the open

	mu       sync.Mutex
	cond     *sync.Cond
	rq       [][]byte // received chunks not yet read
	eof      bool
	err      error // a reset or a failed channel: Read and Write fail
	credit   int   // bytes this end may still send
	unacked  int   // bytes read and not yet returned as credit
	wclosed  bool
	closed   bool
	pending  []*Request             // sends not yet complete, oldest first
	posted   [maxRecvAhead]*Request // recvLoop's receives, for withdraw
	bufs     map[*Request][]byte
	loopDone chan struct{}
}

var chunkPool sync.Pool

func getChunk(n int) []byte {
	if b, ok := chunkPool.Get().([]byte); ok && cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}

func newStream(ep *Endpoint, peer Addr, id uint64, dialer bool, cfg StreamConfig) *Stream {
	s := &Stream{ep: ep, peer: peer, id: id, dialer: dialer, cfg: cfg, credit: cfg.Window,
		bufs: map[*Request][]byte{}, loopDone: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.recvLoop()
	return s
}

// Peer is the endpoint at the other end.
func (s *Stream) Peer() Addr { return s.peer }

// maxRecvAhead bounds StreamConfig.RecvAhead.
const maxRecvAhead = 4

// recvLoop keeps RecvAhead receives posted for the stream's messages from
// the peer and files what arrives, in the order the receives were posted
// (the order the messages matched them): data for Read, credit for Write.
func (s *Stream) recvLoop() {
	defer close(s.loopDone)
	want := streamMatch(s.id, !s.dialer, 0)
	mask := ^uint64(kindMask)
	var bufs [maxRecvAhead][]byte
	var reqs [maxRecvAhead]*Request
	depth := s.cfg.RecvAhead
	post := func(i int) {
		bufs[i] = getChunk(s.cfg.Chunk)
		reqs[i] = s.ep.IrecvFrom(s.peer, bufs[i], want, mask)
		s.mu.Lock()
		s.posted[i] = reqs[i]
		over := s.readOver()
		s.mu.Unlock()
		if over { // withdraw ran before this receive was posted
			s.ep.Cancel(reqs[i])
		}
	}
	for i := range depth {
		post(i)
	}
	defer func() {
		// The stream is over: withdraw the receives still posted.
		for i := range depth {
			if reqs[i] != nil && s.ep.Cancel(reqs[i]) {
				chunkPool.Put(bufs[i][:cap(bufs[i])])
			}
		}
	}()
	for i := 0; ; i = (i + 1) % depth {
		buf, r := bufs[i], reqs[i]
		reqs[i] = nil
		n, match, _, err := r.Status()
		s.mu.Lock()
		s.posted[i] = nil
		if err != nil {
			if s.err == nil && !(s.eof && s.closed) {
				s.err = fmt.Errorf("mx stream %d with %v: %w", s.id, s.peer, err)
			}
			s.cond.Broadcast()
			s.mu.Unlock()
			return
		}
		switch match & kindMask {
		case kindData:
			if n == 0 {
				s.eof = true
			} else if s.closed {
				// Data after Close: nobody will read it (TCP answers
				// with a reset too).
				s.mu.Unlock()
				s.sendCtl(kindReset, nil)
				s.mu.Lock()
				s.err = ErrReset
			} else {
				s.rq = append(s.rq, buf[:n])
				buf = nil
			}
		case kindCredit:
			if n == 4 {
				s.credit += int(binary.BigEndian.Uint32(buf))
			}
		case kindReset:
			s.err = ErrReset
		}
		done := s.err != nil || (s.eof && s.closed)
		s.cond.Broadcast()
		s.mu.Unlock()
		if buf != nil {
			chunkPool.Put(buf[:cap(buf)])
		}
		if done {
			return
		}
		post(i)
	}
}

func (s *Stream) sendCtl(kind uint64, body []byte) error {
	r, err := s.ep.Isend(s.peer, streamMatch(s.id, s.dialer, kind), body)
	if err != nil {
		return err
	}
	_, err = r.Wait(context.Background())
	return err
}

// readOver reports whether nothing the peer may still send matters: the
// stream is closed and the peer's end has arrived, or it is reset. Called
// with s.mu held.
func (s *Stream) readOver() bool { return s.closed && (s.eof || s.err != nil) }

// withdraw cancels the receives recvLoop keeps posted once readOver:
// else a peer that has nothing more to send leaves them, and the loop,
// waiting as long as the endpoint lives.
func (s *Stream) withdraw() {
	s.mu.Lock()
	if !s.readOver() {
		s.mu.Unlock()
		return
	}
	reqs := s.posted
	s.mu.Unlock()
	for _, r := range reqs {
		if r != nil {
			s.ep.Cancel(r)
		}
	}
}

// Read reads bytes the peer wrote; io.EOF after its CloseWrite.
func (s *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	for len(s.rq) == 0 && !s.eof && s.err == nil && !s.closed {
		s.cond.Wait()
	}
	if len(s.rq) == 0 {
		err := s.err
		switch {
		case err != nil:
		case s.closed:
			err = ErrClosed
		default:
			err = io.EOF
		}
		s.mu.Unlock()
		return 0, err
	}
	n := copy(p, s.rq[0])
	if n == len(s.rq[0]) {
		chunkPool.Put(s.rq[0][:cap(s.rq[0])])
		s.rq[0] = nil
		s.rq = s.rq[1:]
	} else {
		s.rq[0] = s.rq[0][n:]
	}
	s.unacked += n
	var grant int
	if s.unacked >= s.cfg.Window/4 {
		grant, s.unacked = s.unacked, 0
	}
	s.mu.Unlock()
	if grant > 0 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(grant))
		s.sendCtl(kindCredit, b[:]) // an error shows in the next Read or Write
	}
	return n, nil
}

// reap collects completed sends; with block, it waits for the oldest.
func (s *Stream) reap(block bool) error {
	for len(s.pending) > 0 {
		r := s.pending[0]
		if block {
			s.mu.Unlock()
			<-r.Done()
			s.mu.Lock()
			block = false
		}
		select {
		case <-r.Done():
		default:
			return nil
		}
		s.pending = s.pending[1:]
		chunkPool.Put(s.bufs[r])
		delete(s.bufs, r)
		if r.err != nil && s.err == nil {
			s.err = fmt.Errorf("mx stream %d with %v: %w", s.id, s.peer, r.err)
		}
	}
	return nil
}

// Write sends p in chunks within the peer's window; it returns once every
// byte is handed to the engine (copied), not when the peer has read them.
func (s *Stream) Write(p []byte) (int, error) {
	done := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	for done < len(p) {
		s.reap(false)
		for s.credit == 0 && s.err == nil && !s.wclosed && !s.closed {
			s.cond.Wait()
		}
		switch {
		case s.err != nil:
			return done, s.err
		case s.wclosed || s.closed:
			return done, fmt.Errorf("mx stream %d: write after close", s.id)
		}
		n := min(len(p)-done, s.cfg.Chunk, s.credit)
		buf := getChunk(n)
		copy(buf, p[done:done+n])
		r, err := s.ep.Isend(s.peer, streamMatch(s.id, s.dialer, kindData), buf)
		if err != nil {
			return done, fmt.Errorf("mx stream %d with %v: %w", s.id, s.peer, err)
		}
		s.credit -= n
		s.pending = append(s.pending, r)
		s.bufs[r] = buf[:cap(buf)]
		done += n
		// Bound the copies held for rendezvous sends in flight.
		if len(s.pending) > s.cfg.Window/s.cfg.Chunk+1 {
			s.reap(true)
		}
	}
	return done, nil
}

// CloseWrite ends the stream toward the peer (its Read returns io.EOF
// after the bytes written before).
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	if s.wclosed || s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	s.wclosed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	return s.sendCtl(kindData, nil)
}

// Flush waits until every chunk written so far has been delivered (eager)
// or pulled (rendezvous) by the peer's engine.
func (s *Stream) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.pending) > 0 {
		s.reap(true)
	}
	return s.err
}

// Abort resets the stream: the peer's Read and Write fail with ErrReset.
func (s *Stream) Abort() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.err = ErrReset
	s.cond.Broadcast()
	s.mu.Unlock()
	s.withdraw()
	return s.sendCtl(kindReset, nil)
}

// Close ends the stream toward the peer and stops reading; data the peer
// sends afterwards resets the stream.
func (s *Stream) Close() error {
	err := s.CloseWrite()
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.withdraw()
	return err
}

// Dial opens a stream from ep to the listener endpoint at to, connecting
// the channel first if needed; meta travels with the open (e.g. who the
// stream is for). The listener need not have accepted it yet.
func Dial(ctx context.Context, ep *Endpoint, to Addr, meta []byte, cfg StreamConfig) (*Stream, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if len(meta) > 1024 {
		return nil, fmt.Errorf("mx: stream metadata of %d bytes, at most 1024", len(meta))
	}
	if err := ep.Connect(ctx, to); err != nil {
		return nil, err
	}
	ep.e.mu.Lock()
	ep.e.streamSeq++
	id := ep.e.streamSeq & maxStreamID
	ep.e.mu.Unlock()
	s := newStream(ep, to, id, true, cfg)
	if err := s.sendCtl(kindOpen, meta); err != nil {
		s.Abort()
		return nil, err
	}
	return s, nil
}

// Listener accepts streams dialed to its endpoint.
type Listener struct {
	ep  *Endpoint
	cfg StreamConfig
}

// Listen accepts streams on ep. One listener per endpoint.
func Listen(ep *Endpoint, cfg StreamConfig) (*Listener, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Listener{ep: ep, cfg: cfg}, nil
}

// Accept waits for the next stream.
func (l *Listener) Accept(ctx context.Context) (*Stream, error) {
	buf := make([]byte, 1024)
	want := streamMatch(0, true, kindOpen)
	mask := uint64(0xff)<<56 | dialerBit | kindMask
	r := l.ep.Irecv(buf, want, mask)
	if _, err := r.Wait(ctx); err != nil && l.ep.Cancel(r) {
		return nil, err
	}
	n, match, from, err := r.Status()
	if err != nil {
		return nil, err
	}
	id := match >> idShift & maxStreamID
	s := newStream(l.ep, from, id, false, l.cfg)
	s.Meta = buf[:n]
	return s, nil
}
