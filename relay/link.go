package relay

// The life of a link, one WAN connection of a trunk:
//
//  1. Trunk.Add (trunk.go): newLink, with its reader (recv.go: newReader);
//  2. start: the writer goroutine (send.go: writeLoop), the reader's
//     first step, the keepalives (keep.go) and queue control (queue.go);
//  3. Open: a stream to the peer (stream.go), its OPEN queued at once;
//  4. fail or Close: every stream reset, the queued frames' buffers and
//     tokens given back, the OnClose functions run (a resuming link's
//     broken connection only takes it down: resume.go); or Drain, which
//     waits for the trunk's streams to end first.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// Conn is the local (LAN) end of a stream. The gateway's LAN transport
// provides it; the relay never needs to know what carries the bytes.
type Conn interface {
	io.Reader
	io.Writer
	// CloseWrite ends the direction toward the application (TCP FIN).
	CloseWrite() error
	// Abort drops the connection with a reset (SO_LINGER 0 + close), so the
	// application sees ECONNRESET.
	Abort() error
	Close() error
}

// BuffersWriter is implemented by a Conn that can write several buffers in
// one system call (writev); the relay then delivers a stream's queued
// payloads with one write.
type BuffersWriter interface {
	WriteBuffers(b *net.Buffers) (int64, error)
}

// Handler receives the streams a peer opens. Open runs on the link's reader
// goroutine and must not block: start the connect elsewhere, then call
// s.Accept or s.Refuse.
type Handler interface {
	Open(s *Stream, o *header.Open)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(s *Stream, o *header.Open)

// Open calls f.
func (f HandlerFunc) Open(s *Stream, o *header.Open) { f(s, o) }

// limited reports a limit the peer hit.
func (l *Link) limited(reason string, err error) {
	if l.cfg.Limited != nil {
		l.cfg.Limited(reason, l.peer.Name, err)
		return
	}
	l.log.Warn("WAN peer hit a limit", "peer", l.peer.Name, "reason", reason, "err", err)
}

// Stats are a link's counters, read atomically by the metrics exporter.
type Stats struct {
	BytesSent, BytesRecv   atomic.Uint64 // DATA payload bytes
	FramesSent, FramesRecv atomic.Uint64
	Writes                 atomic.Uint64 // writev calls on the link socket
	WindowStalls           atomic.Uint64 // times a stream waited for credit
	StreamsOpened          atomic.Uint64
	RTT                    atomic.Int64 // last PING round trip, ns
	RTTs                   RTTHistogram // every PING round trip
	// The poller thread's share (see poller.go): frames it received, and
	// frames it wrote without blocking, of which the socket took only part
	// (the writer sent the rest).
	PollRecv, PollSent, PollPartial atomic.Uint64
	// Frames a stream's own goroutine wrote, blocking, because the link
	// was idle (no hand-off to the writer goroutine).
	InlineSent atomic.Uint64
	// Queue control (queue.go): the receive-window cap this side asks of
	// the peer (bytes, 0 = none), the standing queue it measured (ns), how
	// often it lifted the cap for another flow's queue, and the cap the
	// peer last asked of this side.
	Clamp      atomic.Uint32
	QueueDelay atomic.Int64
	ClampLifts atomic.Uint64
	PeerClamp  atomic.Uint32
	// PAD payload bytes (Pad).
	PadSent, PadRecv atomic.Uint64
}

// Link multiplexes streams over one connection to a peer gateway.
type Link struct {
	conn    net.Conn
	cfg     Config
	peer    header.Hello
	t       *Trunk
	index   int
	express bool
	chunk   int
	log     *slog.Logger
	Stats   Stats

	// The current connection's reader (recv.go) and its state; w is nil
	// without a poller.
	rd     *linkReader
	w      *waiter
	r      *header.Reader
	fill   func([]byte) (int, error) // the non-blocking read (readVia)
	sealed *SealedConn               // the connection, when it is sealed
	ctl    [header.MaxControl]byte
	ob     [header.DataAtPrefix]byte // a DATA_AT frame's offset, as read
	// bulk1: the last frame was a DATA larger than SmallFrame. A link
	// carrying bulk waits in Go's poller: its next bytes are due at once,
	// and the poller thread would only hand the next large frame back.
	bulk1 bool

	dead      atomic.Bool   // failed or closed
	down      atomic.Bool   // broken, waiting to resume (resume.go)
	clampErrs atomic.Uint32 // CLAMP frames the socket refused (logged once)
	queued    atomic.Int64  // DATA bytes handed to this link and not yet written
	homed     atomic.Int32  // streams whose OPEN used this link

	mu sync.Mutex // queues and closing
	// tail: the poller thread's non-blocking write left part of a record
	// in the SealedConn, which the writer sends before anything else.
	tail      bool
	urgent    []frame
	ctlQueued int  // control frames in urgent (MaxControl)
	overflow  bool // ctlQueued passed MaxControl: the link is failing
	bulk      []frame
	ui, bi    int
	writing   bool
	inline    inlineWrite // the inline writer's scratch (send), while writing
	// corked: the poller thread holds the socket (writing) for the frames
	// its current batch of events sends here (cork; send.go's corking),
	// written with corkIOV and corkHdrs; the poller thread's alone.
	corked    bool
	cork      []frame
	corkIOV   net.Buffers
	corkHdrs  []byte
	wake      chan struct{}
	closed    bool
	err       error
	done      chan struct{}
	onClose   []func(error)
	closeOnce sync.Once
	// The connection: replaced when a resuming link resumes (resume.go),
	// under mu while nobody writes; gen counts the connections, so an
	// error from an earlier one is told apart. broken: the current one
	// failed and the link waits for the next.
	gen    uint64
	broken bool
	rs     *resumer // nil: the link does not resume
	remote atomic.Value

	lastRecv atomic.Int64
	// active counts the frames sent and received other than keepalives
	// (keepalive), so the keeper (keep.go) tells an idle link from a busy
	// one; keptActive is its count at the keeper's last tick (the keeper's
	// alone).
	active     atomic.Uint64
	keptActive uint64
	// Quiet links (quiet.go): kernelWatch, the kernel's keepalive watches
	// the current connection and the peer has feature QUIET; quiet, the
	// keeper left the link to it at its last tick, and wokeAt (unix ns)
	// is when the link last stopped being quiet (the keeper's alone).
	kernelWatch atomic.Bool
	quiet       bool
	wokeAt      int64
	// holdUntil (unix ns, 0 = none): nothing is written to the socket
	// before then (Hold).
	holdUntil atomic.Int64
	// sendWatch (WatchSend): each slot is signalled by the next frame
	// sent, then cleared.
	sendWatch [SendWatchSlots]atomic.Pointer[chan<- struct{}]

	// Renewal (HELLO feature RENEW): the trunk has put succ in this link's
	// place. The writer sends RETIRE once its queues are empty, and from
	// then on (retired) hands any frame sent here to succ; the reader reads
	// up to the peer's RETIRE. Then the link closes without resetting any
	// stream: every byte either side wrote before its RETIRE has arrived.
	succ        *Link       // under mu
	renews      atomic.Bool // Add retired a live predecessor for this link
	retired     bool        // under mu
	retireSent  atomic.Bool
	peerRetired atomic.Bool
	renewAsked  atomic.Int64 // when this side last sent RENEW (unix ns)
}

func newLink(conn net.Conn, cfg Config, peer header.Hello, t *Trunk, index int, express bool, session uint64) *Link {
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err) // see Config: the caller validates it at start
	}
	chunk := min(cfg.Chunk, int(peer.MaxPayload))
	if t.lanes {
		chunk = min(chunk, int(peer.MaxPayload)-header.DataAtPrefix)
	}
	l := &Link{conn: conn, cfg: cfg, peer: peer, t: t, index: index, express: express,
		chunk: max(chunk, 1), log: cfg.Logger,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	l.lastRecv.Store(time.Now().UnixNano())
	if conn != nil {
		l.remote.Store(conn.RemoteAddr())
		l.watchConn(conn)
	}
	if session != 0 && peer.Session != 0 && peer.Features&header.FeatureResume != 0 && t.lanes {
		l.rs = newResumer(&l.cfg, session)
	}
	rd := l.newReader(conn, 0)
	if l.rs != nil {
		l.rs.readerDone = rd.done
	}
	return l
}

func (l *Link) start() {
	go l.writeLoop()
	l.rd.start()
	keep(l)
	l.t.startQueueControl(l)
}

// Index is the link's index in its trunk.
func (l *Link) Index() int { return l.index }

// Express reports whether the link is its trunk's express link.
func (l *Link) Express() bool { return l.express }

// Peer is the peer's HELLO.
func (l *Link) Peer() header.Hello { return l.peer }

// Conn is the link's current connection (for socket statistics); a link
// that resumes moves to a new one.
func (l *Link) Conn() net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn
}

// Done is closed when the link has failed or been closed.
func (l *Link) Done() <-chan struct{} { return l.done }

// Err is why the link ended (nil while it runs).
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// closedErr is why the link no longer takes frames.
func (l *Link) closedErr() error {
	if err := l.Err(); err != nil {
		return err
	}
	return net.ErrClosed
}

// OnClose registers f to run once when the link ends.
func (l *Link) OnClose(f func(error)) {
	l.mu.Lock()
	if !l.closed {
		l.onClose = append(l.onClose, f)
		l.mu.Unlock()
		return
	}
	err := l.err
	l.mu.Unlock()
	f(err)
}

// NumStreams is the number of live streams whose home is this link (used
// to spread new streams over parallel links).
func (l *Link) NumStreams() int { return int(l.homed.Load()) }

// ErrLinkClosed is returned by Open on a link that has ended.
var ErrLinkClosed = errors.New("relay: link closed")

// Open starts a stream to the peer for conn. OPEN goes out at once and
// data read from conn follows without waiting for OPEN_OK (up to the peer's
// initial window), so connect() costs no WAN round trip.
func (l *Link) Open(o *header.Open, conn Conn) (*Stream, error) {
	body, err := header.AppendOpen(nil, o)
	if err != nil {
		return nil, err
	}
	s := newStream(l)
	if !l.t.register(s, 0) {
		return nil, ErrLinkClosed
	}
	l.Stats.StreamsOpened.Add(1)
	l.enqueue(frame{h: header.Header{Type: header.TypeOpen, Stream: s.id, Length: uint32(len(body))}, body: body}, nil)
	s.attach(conn)
	return s, nil
}

// fail ends the link: the connection is closed and every stream is reset
// toward its application (code 7, link lost); the peer sees the
// connection drop and does the same on its side.
func (l *Link) fail(err error) {
	l.closeOnce.Do(func() {
		cbs := l.closing(err)
		l.mu.Lock() // nothing joins the queues of a closed link
		for i := l.bi; i < len(l.bulk); i++ {
			putBuf(l.bulk[i].buf)
			l.bulk[i].s.returnToken()
		}
		for i := l.ui; i < len(l.urgent); i++ {
			if f := &l.urgent[i]; f.isData() {
				if !f.kept { // else the replay list's, freed below
					putBuf(f.buf)
				}
				f.s.returnToken()
			}
		}
		l.urgent, l.bulk, l.ui, l.bi, l.ctlQueued = nil, nil, 0, 0, 0
		conn, w, rd := l.conn, l.w, l.rd
		l.mu.Unlock()
		if l.rs != nil {
			l.rs.release()
		}
		close(l.done)
		w.cancel() // before the socket closes: its number may be reused
		if tc := TCPOf(conn); tc != nil {
			tc.SetLinger(0) // the peer learns at once, even with data queued
		}
		conn.Close()
		rd.stop()
		// The peer sees the same connection fail and resets the streams homed
		// here itself; a stream homed elsewhere whose bytes crossed this link
		// is reset explicitly on its home link (the peer may not know that
		// its bytes were lost).
		home, crossing := l.t.down(l)
		for _, s := range home {
			s.remoteReset(header.CodeLinkLost)
		}
		for _, s := range crossing {
			s.Reset(header.CodeLinkLost)
		}
		l.log.Info("link down", "peer", l.peer.Name, "link", l.index, "remote", l.remoteAddr(),
			"streams_reset", len(home)+len(crossing), "err", err)
		for _, f := range cbs {
			f(err)
		}
	})
}

// closing marks the link ended by err and takes its OnClose callbacks.
func (l *Link) closing(err error) []func(error) {
	l.dead.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.err = err
	cbs := l.onClose
	l.onClose = nil
	return cbs
}

// Close ends the link at once (streams are reset with "link lost").
func (l *Link) Close() error {
	l.fail(ErrLinkClosed)
	return nil
}

// Drain waits until the link's trunk has no streams (any stream may use any
// link of a trunk) or ctx ends, then resets what is left with code 6
// (gateway shutting down), lets the writer flush, and closes the link.
func (l *Link) Drain(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for l.t.NumStreams() > 0 {
		select {
		case <-ctx.Done():
			for _, s := range l.t.all() {
				s.Reset(header.CodeShutdown)
			}
			l.flush(200 * time.Millisecond)
			l.Close()
			return
		case <-t.C:
		case <-l.done:
			return
		}
	}
	l.flush(200 * time.Millisecond)
	l.Close()
}

// flush waits (bounded) until everything queued has been written.
func (l *Link) flush(limit time.Duration) {
	d := make(chan struct{})
	if !l.enqueue(frame{h: header.Header{Type: header.TypePing, Length: 8}, done: d}, nil) {
		return
	}
	select {
	case <-d:
	case <-time.After(limit):
	case <-l.done:
	}
}

// Alive sends a PING and reports whether the peer sends anything on the
// link within wait: false if the link ends or stays silent. The gateway
// asks before it lets a new connection replace the link.
func (l *Link) Alive(wait time.Duration) bool {
	since := time.Now().UnixNano()
	f := frame{h: header.Header{Type: header.TypePing, Length: 8}}
	header.PutU32(f.ctl[:4], uint32(uint64(since)>>32))
	header.PutU32(f.ctl[4:], uint32(since))
	if !l.enqueue(f, nil) {
		return false
	}
	end := time.NewTimer(wait)
	defer end.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-l.done:
			return false
		case <-tick.C:
			if l.lastRecv.Load() > since {
				return true
			}
		case <-end.C:
			return l.lastRecv.Load() > since
		}
	}
}
