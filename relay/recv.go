package relay

// The read side of a link. A frame passes
//
//  1. linkReader.step, the reader's stage (stage.go): on the poller
//     thread while the link is idle (the frames that have arrived whole),
//     else on a worker with blocking reads;
//  2. handle, handleFrame: counted, and told apart: DATA, PAD, control;
//  3. recvData, for DATA: the payload read straight into a pooled buffer
//     and pushed to its stream (inbound.go: reserve, pushAt);
//  4. dispatch, for a control frame: to its stream (OPEN to the trunk's
//     Handler, OPEN_OK, RESET, HALF_CLOSE, WINDOW: addCredit) or to the
//     link (PING, PONG, CLAMP, ACK, RETIRE, RENEW);
//  5. fail, end, when reading ends: the link learns why (readEnd, renew.go).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// errPeerClosed is a link whose peer closed the connection between frames.
var errPeerClosed = errors.New("relay: peer closed the link")

// readErr names a clean end of the link's byte stream.
func readErr(err error) error {
	if err == io.EOF {
		return errPeerClosed
	}
	return err
}

// The link's reader: one stage (stage.go) per connection of the link.
//
// Its step reads frames and handles them (a DATA goes to its stream's
// receive queue, a WINDOW to its out-stage, ...). While the link is idle
// the connection is armed with the poller thread, which runs the step when
// bytes arrive: it handles every frame that has arrived whole without
// blocking, and waits again. A frame it cannot read whole (a large DATA, or
// one still arriving), end of file and errors go to a worker goroutine,
// which reads on with blocking reads. A link carrying bulk (bulk1) reads
// there too, in Go's poller: its next bytes are due at once, and the
// poller thread would only hand the next large frame back. So an idle link
// holds no goroutine, and without a poller (Config.NoPoller, a connection
// that is not a kernel socket) the same step reads with blocking reads on
// its worker.
type linkReader struct {
	l    *Link
	g    stage
	r    *header.Reader
	w    *waiter // nil: blocking reads only
	gen  uint64  // the connection's generation (resume.go)
	done chan struct{}
	err  error // what ended reading on the poller thread, for the worker
}

// newReader makes the reader of connection conn, generation gen, and sets
// the link's reading state (l.r, l.w, readVia) to it. It starts at start.
func (l *Link) newReader(conn net.Conn, gen uint64) *linkReader {
	rd := &linkReader{l: l, gen: gen, done: make(chan struct{})}
	rd.g.step, rd.g.traffic = rd.step, &l.active
	rd.r = header.NewReader(conn, readerSize(conn))
	if !l.cfg.NoPoller {
		rd.w = newWaiter(conn, &rd.g, !l.cfg.RuntimeWakes)
	}
	l.r, l.w, l.rd = rd.r, rd.w, rd
	l.readVia(conn, rd.w)
	return rd
}

// start runs the reader's first step on a worker.
func (rd *linkReader) start() { rd.g.kick() }

// stop makes the reader see that its connection is closed: called after
// Close, so that its next step reads the error wherever it waits.
func (rd *linkReader) stop() {
	if rd != nil {
		rd.g.kick()
	}
}

// step is the reader's step: see linkReader.
func (rd *linkReader) step(onPoller bool) waitOn {
	l, r := rd.l, rd.r
	if rd.err != nil { // from the poller thread: end here, off it
		return rd.end(rd.err)
	}
	for {
		if rd.w != nil && (onPoller || !l.bulk1) && r.Remaining() == 0 {
			// Without blocking: read what the socket holds and handle
			// every frame that has arrived whole.
			room := r.Room()
			n, rerr := r.FillFrom(l.fill)
			// Frames already whole in the buffer go first, even when the
			// read found the end of the stream: a blocking read may have
			// buffered them, and a peer that closes right after its last
			// frame (RETIRE) sends that frame and its FIN together.
			for r.FrameBuffered() {
				h, err := r.Next()
				if err == nil {
					if onPoller {
						l.Stats.PollRecv.Add(1)
					}
					err = l.handle(r, h)
				}
				if err != nil {
					return rd.fail(onPoller, err)
				}
			}
			if rerr != nil && rerr != errWouldBlock {
				return rd.fail(onPoller, readErr(rerr))
			}
			if n > 0 && (n == room || l.sealedBuffered()) {
				continue // the socket may hold more
			}
			if r.Buffered() == 0 && !l.sealedBuffered() {
				// Drained. An idle link holds no read buffer. A sealed
				// link's is record-sized, not the pool's size: it keeps
				// it rather than allocate 320 KiB per message.
				if l.sealed == nil {
					r.Release()
				}
				if onPoller || rd.w.arm() {
					return onReadable
				}
			}
			// A partial frame, or a record already read and not yet
			// opened, which must not wait for the socket's next bytes.
		}
		if onPoller {
			return onGoroutine
		}
		rd.w.loud() // Go's poller waits for the socket now
		h, err := r.Next()
		if err == nil {
			err = l.handle(r, h)
		}
		if err != nil {
			return rd.end(err)
		}
	}
}

// fail ends the reader with err, on a worker when on the poller thread:
// ending a link closes sockets and runs callbacks.
func (rd *linkReader) fail(onPoller bool, err error) waitOn {
	if onPoller {
		rd.err = err
		return onGoroutine
	}
	return rd.end(err)
}

// end ends the reader: the link learns why, the socket leaves the poller.
func (rd *linkReader) end(err error) waitOn {
	rd.l.readEnd(rd.gen, err)
	rd.w.close()
	close(rd.done)
	return finished
}

// readVia sets how the reader of connection conn (waited for by w) reads
// without blocking: w's raw read, through the record layer on a sealed
// connection. Called before the connection's reader starts.
func (l *Link) readVia(conn net.Conn, w *waiter) {
	l.sealed, _ = conn.(*SealedConn)
	l.fill = nil
	switch {
	case w == nil:
	case l.sealed != nil:
		sc := l.sealed
		l.fill = func(p []byte) (int, error) { return sc.readWith(p, w.read) }
	default:
		l.fill = w.read
	}
}

// sealedBuffered reports whether the link's SealedConn holds record
// bytes it can hand over without reading the socket.
func (l *Link) sealedBuffered() bool { return l.sealed != nil && l.sealed.r.Buffered() }

// handle processes one received frame whose header r has just read; a
// resuming link counts it once it is handled whole.
func (l *Link) handle(r *header.Reader, h header.Header) error {
	err := l.handleFrame(r, h)
	if err == nil && l.rs != nil {
		l.received(h)
	}
	return err
}

func (l *Link) handleFrame(r *header.Reader, h header.Header) error {
	l.lastRecv.Store(time.Now().UnixNano())
	l.Stats.FramesRecv.Add(1)
	if !keepalive(h.Type) {
		l.active.Add(1)
	}
	l.bulk1 = false
	if h.Type == header.TypeData || h.Type == header.TypeDataAt {
		l.bulk1 = int(h.Length) > l.cfg.SmallFrame
		return l.recvData(r, h)
	}
	if h.Type == header.TypePad {
		if l.peer.Features&header.FeaturePad == 0 {
			return fmt.Errorf("relay: protocol error from %v: PAD from a peer without feature PAD", l.remoteAddr())
		}
		l.bulk1 = int(h.Length) > l.cfg.SmallFrame
		l.Stats.PadRecv.Add(uint64(h.Length))
		return r.Discard()
	}
	p := l.ctl[:h.Length]
	if err := readPayload(r, p); err != nil {
		return err
	}
	if err := l.dispatch(h, p); err != nil {
		if err == errPeerRetired {
			return err
		}
		return fmt.Errorf("relay: protocol error from %v: %w", l.remoteAddr(), err)
	}
	return nil
}

// readPayload fills b from the current frame's payload.
func readPayload(r *header.Reader, b []byte) error {
	for len(b) > 0 {
		if r.Remaining() == 0 {
			return io.ErrUnexpectedEOF
		}
		n, err := r.ReadPayload(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (l *Link) lookup(id uint32) *Stream { return l.t.lookup(id) }

// recvData reads a DATA payload straight into a buffer that then belongs to
// the stream's receive queue (or, for DATA_AT ahead of its turn, to the
// stream's reorder list).
func (l *Link) recvData(r *header.Reader, h header.Header) error {
	n := int(h.Length)
	var off uint32
	at := h.Type == header.TypeDataAt
	if at {
		ob := l.ob[:] // the reader's own: on the stack it would escape into the read
		if err := readPayload(r, ob); err != nil {
			return err
		}
		off, _ = header.DecodeOffset(ob)
		n -= header.DataAtPrefix
	}
	s := l.lookup(h.Stream)
	if s == nil {
		return r.Discard() // the stream was reset; its data in flight is dropped
	}
	s.used.Or(1 << l.index)
	if !s.reserve(n) {
		return fmt.Errorf("relay: protocol error from %v: stream %d sent %d bytes beyond its window", l.remoteAddr(), h.Stream, n)
	}
	p := getBuf(n)
	if err := readPayload(r, *p); err != nil {
		putBuf(p)
		s.unreserve(n) // the frame comes again whole if the link resumes
		return err
	}
	l.Stats.BytesRecv.Add(uint64(n))
	if err := s.pushAt(off, at, p); err == errEarly {
		s.Reset(header.CodeLimit)
		l.limited("early_data", fmt.Errorf("relay: peer %s: stream %d reset: its DATA would pass the %d bytes buffered for streams whose destination is not connected yet",
			l.peer.Name, h.Stream, l.cfg.MaxEarly))
		return nil
	} else if err != nil {
		return fmt.Errorf("relay: protocol error from %v: stream %d: %w", l.remoteAddr(), h.Stream, err)
	}
	return nil
}

func (l *Link) dispatch(h header.Header, p []byte) error {
	switch h.Type {
	case header.TypeOpen:
		// Our ids are odd if we dialed (t.dialer never changes; nextID
		// is the allocator's, under t.mu).
		if h.Stream == 0 || (h.Stream&1 == 1) == l.t.dialer {
			return fmt.Errorf("OPEN with stream id %d of the wrong parity", h.Stream)
		}
		o, err := header.ParseOpen(p)
		if err != nil {
			return err
		}
		s := newStream(l)
		s.confirmed.Store(true) // we know it; the peer made it
		if !l.t.register(s, h.Stream) {
			if l.dead.Load() {
				return nil
			}
			return fmt.Errorf("OPEN of stream %d, which is open", h.Stream)
		}
		l.Stats.StreamsOpened.Add(1)
		if l.t.handler == nil {
			s.Refuse(header.CodePolicy)
			return nil
		}
		l.t.handler.Open(s, &o)
	case header.TypeOpenOK:
		// The opener already streams; from now on its DATA may take any
		// link of the trunk.
		if s := l.lookup(h.Stream); s != nil {
			s.confirmed.Store(true)
		}
	case header.TypeOpenRefused, header.TypeReset:
		code, err := header.DecodeCode(p)
		if err != nil {
			return err
		}
		if s := l.lookup(h.Stream); s != nil {
			s.remoteReset(header.Code(code))
		}
	case header.TypeHalfClose:
		s := l.lookup(h.Stream)
		if s == nil {
			return nil
		}
		if len(p) == 0 {
			s.pushEOF()
			return nil
		}
		end, err := header.DecodeOffset(p)
		if err != nil {
			return err
		}
		return s.pushEnd(end)
	case header.TypeWindow:
		n, err := header.DecodeWindow(p)
		if err != nil {
			return err
		}
		if s := l.lookup(h.Stream); s != nil {
			s.addCredit(int64(n))
		}
	case header.TypePing:
		f := frame{h: header.Header{Type: header.TypePong, Length: 8}}
		copy(f.ctl[:], p)
		l.enqueue(f, nil)
	case header.TypeClamp:
		n, err := header.DecodeClamp(p)
		if err != nil {
			return err
		}
		l.applyClamp(n)
	case header.TypePong:
		var t int64
		for _, b := range p {
			t = t<<8 | int64(b)
		}
		if l.rs != nil && t < l.rs.resumedAt.Load() {
			break // a PING from before a resume: its round trip spans the outage
		}
		if rtt := time.Now().UnixNano() - t; t != 0 && rtt > 0 { // t is 0 for flush markers
			l.Stats.RTT.Store(rtt)
			l.Stats.RTTs.Observe(time.Duration(rtt))
		}
	case header.TypeAck:
		n, err := header.DecodeAck(p)
		if err != nil {
			return err
		}
		return l.acked(n)
	case header.TypeRetire:
		if !l.renewable() {
			return fmt.Errorf("RETIRE on a link that cannot be renewed")
		}
		return errPeerRetired
	case header.TypeRenew:
		if !l.renewable() || !l.t.dialer {
			return fmt.Errorf("RENEW on a link this side does not dial")
		}
		l.t.askRenew()
	default:
		return fmt.Errorf("unexpected %v on a WAN link", h.Type)
	}
	return nil
}
