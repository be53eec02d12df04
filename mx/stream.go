package mx

import (
	"cmp"
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

// StreamConfig sizes streams. The zero value of a field means its default
// (DefaultStreamConfig); Dial and Listen fill zero fields from it and call
// Validate.
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

// DefaultStreamConfig returns the defaults StreamConfig's fields document.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{Chunk: 64 << 10, Window: 512 << 10, RecvAhead: 1}
}

// fillDefaults gives zero fields their defaults (DefaultStreamConfig).
func (c *StreamConfig) fillDefaults() {
	d := DefaultStreamConfig()
	c.Chunk = cmp.Or(c.Chunk, d.Chunk)
	c.Window = cmp.Or(c.Window, d.Window)
	if c.RecvAhead == 0 {
		c.RecvAhead = d.RecvAhead
	}
}

// Validate reports the first field out of range, zero fields standing for
// their defaults.
func (c *StreamConfig) Validate() error {
	v := *c
	v.fillDefaults()
	if v.Chunk < 1 || v.Window < v.Chunk {
		return fmt.Errorf("mx: stream Chunk %d and Window %d: want 0 < Chunk <= Window (0 takes the default, %d and %d)", v.Chunk, v.Window, DefaultStreamConfig().Chunk, DefaultStreamConfig().Window)
	}
	if v.RecvAhead < 1 || v.RecvAhead > maxRecvAhead {
		return fmt.Errorf("mx: stream RecvAhead %d out of range 1..%d (0 takes the default, 1)", v.RecvAhead, maxRecvAhead)
	}
	return nil
}

// ErrReset is what Read and Write return after the peer aborted the stream.
var ErrReset = errors.New("mx: stream reset by peer")

// Stream is one byte stream; it implements io.ReadWriteCloser plus
// CloseWrite (end of stream toward the peer) and Abort (reset), and
// TryRead with NotifyReadable for a reader that must not wait (the
// gateway's relay).
//
// A stream keeps RecvAhead receives posted for its peer's messages. They
// take a buffer only once a message matches them, and the engine runs
// received when one is done: an idle stream holds no buffer and no
// goroutine.
type Stream struct {
	ep     *Endpoint
	peer   Addr
	id     uint64
	dialer bool
	cfg    StreamConfig
	Meta   []byte // what the dialer sent with the open
	want   uint64 // match bits of the peer's messages (any kind)
	onRecv func() // received, made once: every receive's notify

	mu   sync.Mutex
	cond *sync.Cond
	rq   [][]byte // received chunks not yet read
	eof  bool
	err  error // a reset or a failed channel: Read and Write fail
	// halted is closed once err is set: a Write waiting for a send the
	// peer will never pull (it reset the stream, or its channel failed)
	// stops waiting.
	halted  chan struct{}
	credit  int // bytes this end may still send
	unacked int // bytes read and not yet returned as credit
	wclosed bool
	closed  bool
	pending []*Request // sends not yet complete, oldest first
	bufs    map[*Request][]byte
	// The posted receives, oldest first (the order messages match
	// them): ring[rhead], then rn-1 more.
	ring      [maxRecvAhead]*Request
	rhead, rn int
	// readable runs when bytes, the end or an error arrive
	// (NotifyReadable).
	readable func()
	// recvDone is closed once no receive is posted and none will be.
	recvDone  chan struct{}
	recvEnded bool
}

var chunkPool sync.Pool

func getChunk(n int) []byte {
	if b, ok := chunkPool.Get().([]byte); ok && cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}

func putChunk(b []byte) {
	if b != nil {
		chunkPool.Put(b[:cap(b)])
	}
}

func newStream(ep *Endpoint, peer Addr, id uint64, dialer bool, cfg StreamConfig) *Stream {
	s := &Stream{ep: ep, peer: peer, id: id, dialer: dialer, cfg: cfg, credit: cfg.Window,
		want: streamMatch(id, !dialer, 0), bufs: map[*Request][]byte{}, recvDone: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	s.halted = make(chan struct{})
	s.onRecv = s.received
	s.mu.Lock()
	s.repost()
	s.mu.Unlock()
	return s
}

// Peer is the endpoint at the other end.
func (s *Stream) Peer() Addr { return s.peer }

// maxRecvAhead bounds StreamConfig.RecvAhead.
const maxRecvAhead = 4

// recvOver reports whether the stream takes no more messages: it failed,
// or it is closed and the peer's end arrived. Called with s.mu held.
func (s *Stream) recvOver() bool { return s.err != nil || s.eof && s.closed }

// repost keeps RecvAhead receives posted until recvOver. Called with s.mu
// held (the engine's lock comes after it).
func (s *Stream) repost() {
	for s.rn < s.cfg.RecvAhead && !s.recvOver() {
		r := s.ep.irecvLazy(s.peer, s.cfg.Chunk, s.want, exactMask, s.onRecv)
		s.ring[(s.rhead+s.rn)%maxRecvAhead] = r
		s.rn++
	}
	if !s.recvOver() {
		return
	}
	// Withdraw the receives still posted: else a peer that has nothing
	// more to send leaves them posted as long as the endpoint lives. Each
	// ends with ErrCanceled, and received takes it out of the ring; one
	// that a message matched already ends with it.
	for i := range s.rn {
		if r := s.ring[(s.rhead+i)%maxRecvAhead]; !r.isDone() {
			s.ep.Cancel(r)
		}
	}
	if s.rn == 0 && !s.recvEnded {
		s.recvEnded = true
		close(s.recvDone)
	}
}

// received files what the receives done, oldest first, got (data for
// Read, credit for Write), posts new ones and tells the reader. It is
// every receive's notify: it runs on the engine's goroutines and never
// waits.
func (s *Stream) received() {
	reset := false
	s.mu.Lock()
	for s.rn > 0 && s.ring[s.rhead].isDone() {
		r := s.ring[s.rhead]
		s.ring[s.rhead] = nil
		s.rhead = (s.rhead + 1) % maxRecvAhead
		s.rn--
		reset = s.file(r) || reset
	}
	s.repost()
	readable := s.readable
	s.cond.Broadcast()
	s.mu.Unlock()
	if reset {
		s.postCtl(kindReset, nil)
	}
	if readable != nil {
		readable()
	}
}

// file takes in what receive r got; with s.mu held. It reports whether
// the peer must be reset (it sent data after Close).
func (s *Stream) file(r *Request) (reset bool) {
	buf := r.buf
	defer func() { putChunk(buf) }()
	if r.err != nil {
		// Canceled (withdraw), or the channel failed.
		if s.err == nil && !(s.eof && s.closed) {
			s.err = fmt.Errorf("mx stream %d with %v: %w", s.id, s.peer, r.err)
			s.halt()
		}
		return false
	}
	if s.err != nil {
		return false // reset or failed already: nobody reads it
	}
	switch r.match & kindMask {
	case kindData:
		switch {
		case r.n == 0:
			s.eof = true
		case s.closed:
			// Data after Close: nobody will read it (TCP answers with a
			// reset too).
			s.err = ErrReset
			s.halt()
			return true
		default:
			s.rq = append(s.rq, buf[:r.n])
			buf = nil
		}
	case kindCredit:
		if r.n == 4 {
			s.credit += int(binary.BigEndian.Uint32(buf))
		}
	case kindReset:
		s.err = ErrReset
		s.halt()
	}
	return false
}

func (s *Stream) sendCtl(kind uint64, body []byte) error {
	r, err := s.ep.Isend(s.peer, streamMatch(s.id, s.dialer, kind), body)
	if err != nil {
		return err
	}
	_, err = r.Wait(context.Background())
	return err
}

// postCtl sends a control message without waiting for the engine to take
// it (body is the caller's no more): a credit from a reader that must not
// wait, a reset. A failure shows in the stream's next Read or Write, when
// the channel's failure reaches its receives.
func (s *Stream) postCtl(kind uint64, body []byte) error {
	_, err := s.ep.Isend(s.peer, streamMatch(s.id, s.dialer, kind), body)
	return err
}

// withdraw cancels the posted receives once the stream takes no more
// messages (repost).
func (s *Stream) withdraw() {
	s.mu.Lock()
	s.repost()
	s.mu.Unlock()
}

// Read reads bytes the peer wrote; io.EOF after its CloseWrite.
func (s *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	for !s.readyLocked() {
		s.cond.Wait()
	}
	return s.readLocked(p)
}

// TryRead is Read that never waits: 0 and no error when nothing has
// arrived. A reader that must not block (it runs in NotifyReadable's
// callback) reads with it.
func (s *Stream) TryRead(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	if !s.readyLocked() {
		s.mu.Unlock()
		return 0, nil
	}
	return s.readLocked(p)
}

// Readable reports whether Read would return at once (bytes, the end of
// the stream or an error).
func (s *Stream) Readable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readyLocked()
}

// NotifyReadable has f run each time a message of the peer's arrives or
// the stream fails: then Read may not wait. f runs on the engine's
// goroutines, must not block and may call TryRead. nil: no more calls.
func (s *Stream) NotifyReadable(f func()) {
	s.mu.Lock()
	s.readable = f
	s.mu.Unlock()
}

func (s *Stream) readyLocked() bool { return len(s.rq) > 0 || s.eof || s.err != nil || s.closed }

// readLocked reads what readyLocked found; it unlocks s.mu.
func (s *Stream) readLocked(p []byte) (int, error) {
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
		putChunk(s.rq[0])
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
		b := make([]byte, 4)
		binary.BigEndian.PutUint32(b, uint32(grant))
		s.postCtl(kindCredit, b)
	}
	return n, nil
}

// halt closes halted, once. Called with s.mu held, when err is set.
func (s *Stream) halt() {
	select {
	case <-s.halted:
	default:
		close(s.halted)
	}
}

// reap collects completed sends; with block, it waits for the oldest
// (or until the stream fails).
func (s *Stream) reap(block bool) error {
	for len(s.pending) > 0 {
		r := s.pending[0]
		if block {
			s.mu.Unlock()
			select {
			case <-r.Done():
			case <-s.halted:
			}
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
			s.halt()
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
	for len(s.pending) > 0 && s.err == nil {
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
	s.halt()
	s.cond.Broadcast()
	s.mu.Unlock()
	s.withdraw()
	return s.postCtl(kindReset, nil)
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
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
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
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
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
	s.Meta = append([]byte(nil), buf[:n]...) // not the 1 KiB buffer, for the stream's life
	return s, nil
}
