package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
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

// Config tunes a link. Zero fields take the defaults.
type Config struct {
	Chunk      int    // largest DATA payload sent (default 128 KiB, clamped to the peer's max payload)
	Window     uint32 // credit granted to the peer on every new stream (default 1 MiB)
	SmallFrame int    // DATA up to this many bytes is scheduled ahead of bulk (default 16 KiB)
	ExpressMax int    // largest burst a trunk's express link takes (default SmallFrame; see Trunk)
	MaxBatch   int    // most frames per writev (default 64)
	// Pipeline is how many chunks of one stream may wait for the link
	// writer (default 2): with two, a stream reads chunk B from its
	// application while the writer sends chunk A (double buffering), and no
	// stream can hog the writer's queue.
	Pipeline     int
	PingInterval time.Duration // keepalive period (default 1 s)
	DeadAfter    time.Duration // a link silent this long is dead (default 4 × PingInterval)
	Logger       *slog.Logger
	// NoPoller keeps idle sockets in Go's network poller instead of the
	// relay's poller thread (see poller.go); for measuring the difference.
	NoPoller bool
	// RuntimeWakes leaves Go's runtime watching the input of sockets the
	// poller thread owns, so each arriving byte also wakes a runtime
	// thread (rtquiet.go); for measuring the difference.
	RuntimeWakes bool
	// QueueTarget turns on queue control (queue.go) on bulk links whose
	// peer applies CLAMP frames: the WAN bottleneck queue a saturating
	// link may keep (0 = off).
	QueueTarget time.Duration
	// MaxControl is the most control frames (PONG, WINDOW, OPEN_REFUSED,
	// ...) that may wait unsent on the link (default 65536: 88 bytes
	// each, at most 11 MiB while the queue grows). A peer that sends
	// requests and does not read the replies would grow the queue without
	// bound: past the limit the link fails. The default stays above the
	// frames a burst of stream setups (OPEN, OPEN_OK, ...) queues while the
	// WAN stalls for a few seconds, which the stream limits bound.
	MaxControl int
	// MaxEarly is the most DATA bytes a trunk buffers for streams whose
	// destination is not connected yet (default 64 MiB). Each stream's
	// window bounds its own; past the trunk's limit the stream whose DATA
	// overflows it is reset (code 10, limit).
	MaxEarly int64
	// Limited, if set, is told of every limit a peer hits (reason
	// "control_queue" or "early_data"), so the gateway can count and log
	// it; else the link logs a warning. It may run on the poller thread:
	// it must not block.
	Limited func(reason string, peer string, err error)
}

func (c *Config) fill() {
	if c.Chunk <= 0 {
		c.Chunk = 128 << 10
	}
	c.Chunk = min(c.Chunk, header.MaxPayload)
	if c.Window == 0 {
		c.Window = 1 << 20
	}
	if c.SmallFrame <= 0 {
		c.SmallFrame = 16 << 10
	}
	if c.ExpressMax <= 0 {
		c.ExpressMax = c.SmallFrame
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 64
	}
	if c.Pipeline <= 0 {
		c.Pipeline = 2
	}
	if c.PingInterval <= 0 {
		c.PingInterval = time.Second
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = 4 * c.PingInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxControl <= 0 {
		c.MaxControl = 1 << 16
	}
	if c.MaxEarly <= 0 {
		c.MaxEarly = 64 << 20
	}
}

// limited reports a limit the peer hit.
func (l *Link) limited(reason string, err error) {
	if l.cfg.Limited != nil {
		l.cfg.Limited(reason, l.peer.Name, err)
		return
	}
	l.log.Warn("WAN peer hit a limit", "peer", l.peer.Name, "reason", reason, "err", err)
}

// Hello returns the HELLO a side with this configuration sends.
func (c Config) Hello(site uint8, name string, index, count uint8) header.Hello {
	c.fill()
	return header.Hello{SiteID: site, LinkIndex: index, LinkCount: count,
		MaxPayload: header.MaxPayload, Window: c.Window, Name: name}
}

// Handshake sends our HELLO and reads the peer's, both before ctx's
// deadline. The caller checks the peer's identity before NewLink.
func Handshake(ctx context.Context, conn net.Conn, local header.Hello) (header.Hello, error) {
	body, err := header.AppendHello(nil, &local)
	if err != nil {
		return header.Hello{}, err
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	errc := make(chan error, 1)
	go func() { _, err := conn.Write(header.AppendFrame(nil, header.TypeHello, 0, body)); errc <- err }()
	// No read-ahead: the link's Reader takes over the connection afterwards.
	h, p, err := header.ReadOne(conn, header.MaxControl)
	if err == nil && h.Type != header.TypeHello {
		err = fmt.Errorf("relay: first frame is %v, want HELLO", h.Type)
	}
	var peer header.Hello
	if err == nil {
		peer, err = header.ParseHello(p)
	}
	if werr := <-errc; err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return peer, fmt.Errorf("relay: hello with %v: %w", conn.RemoteAddr(), err)
	}
	return peer, nil
}

// Stats are a link's counters, read atomically by the metrics exporter.
type Stats struct {
	BytesSent, BytesRecv   atomic.Uint64 // DATA payload bytes
	FramesSent, FramesRecv atomic.Uint64
	Writes                 atomic.Uint64 // writev calls on the link socket
	WindowStalls           atomic.Uint64 // times a stream waited for credit
	StreamsOpened          atomic.Uint64
	RTT                    atomic.Int64 // last PING round trip, ns
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

	// The reader's state, which the poller thread uses while the link is
	// idle (see poller.go); w is nil without a poller.
	w    *waiter
	r    *header.Reader
	ctl  [header.MaxControl]byte
	ob   [header.DataAtPrefix]byte // a DATA_AT frame's offset, as read
	rerr error                     // what ended the poller's reading
	// bulk1: the last frame was a DATA larger than SmallFrame. A link
	// carrying bulk waits in Go's poller: its next bytes are due at once,
	// and the poller thread would only hand the next large frame back.
	bulk1 bool

	dead      atomic.Bool   // failed or closed
	clampErrs atomic.Uint32 // CLAMP frames the socket refused (logged once)
	queued    atomic.Int64  // DATA bytes handed to this link and not yet written
	homed     atomic.Int32  // streams whose OPEN used this link

	mu        sync.Mutex // queues and closing
	urgent    []frame
	ctlQueued int  // control frames in urgent (MaxControl)
	overflow  bool // ctlQueued passed MaxControl: the link is failing
	bulk      []frame
	ui, bi    int
	writing   bool
	inline    inlineWrite // the inline writer's scratch (send), while writing
	wake      chan struct{}
	closed    bool
	err       error
	done      chan struct{}
	onClose   []func(error)
	closeOnce sync.Once

	lastRecv atomic.Int64
	// holdUntil (unix ns, 0 = none): nothing is written to the socket
	// before then (Hold).
	holdUntil atomic.Int64
	// sendWatch (WatchSend): signalled by the next frame sent, then cleared.
	sendWatch atomic.Pointer[chan<- struct{}]

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

func newLink(conn net.Conn, cfg Config, peer header.Hello, t *Trunk, index int, express bool) *Link {
	cfg.fill()
	chunk := min(cfg.Chunk, int(peer.MaxPayload))
	if t.lanes {
		chunk = min(chunk, int(peer.MaxPayload)-header.DataAtPrefix)
	}
	l := &Link{conn: conn, cfg: cfg, peer: peer, t: t, index: index, express: express,
		chunk: max(chunk, 1), log: cfg.Logger,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	l.lastRecv.Store(time.Now().UnixNano())
	l.r = header.NewReader(conn, 0)
	if !cfg.NoPoller {
		l.w = newWaiter(conn, l.readStep, !cfg.RuntimeWakes)
	}
	return l
}

func (l *Link) start() {
	go l.writeLoop()
	go l.readLoop()
	go l.keepalive()
	l.t.startQueueControl(l)
}

// Index is the link's index in its trunk.
func (l *Link) Index() int { return l.index }

// Express reports whether the link is its trunk's express link.
func (l *Link) Express() bool { return l.express }

// Peer is the peer's HELLO.
func (l *Link) Peer() header.Hello { return l.peer }

// Conn is the link's connection (for socket statistics).
func (l *Link) Conn() net.Conn { return l.conn }

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

// enqueue schedules f. Control frames go to the urgent queue; DATA of more
// than SmallFrame bytes goes to the bulk queue, and so does every later frame
// of a stream while it has bulk frames waiting, so a stream's bytes and its
// HALF_CLOSE never overtake each other.
func (l *Link) enqueue(f frame, s *Stream) bool { return l.send(f, s, sendQueue) }

// How send may write a frame itself.
type sendMode int

const (
	sendQueue  sendMode = iota // never: the writer goroutine does
	sendInline                 // when the link is idle, blocking
	sendTry                    // when the link is idle, without blocking (the poller thread)
)

// send is enqueue with an inline fast path: unless mode is sendQueue, and
// nobody is writing or waiting, the caller writes the frame to the socket
// itself. That saves the hand-off to the writer goroutine, a thread
// wake-up of several microseconds: on the small-message path it is
// latency, and for a bulk stream on an idle link, one wake-up per chunk,
// it cost the sending gateway 8-23 % of its forwarding rate per
// CPU-second (medians of BenchmarkForward, bench/figures/forwarding). Only stream
// pumps write inline: the link reader must never block on a write, or two
// gateways could deadlock each waiting for the other to read. The poller
// thread reads links too, so it writes with sendTry, small frames only:
// whatever the socket does not take at once goes to the writer.
func (l *Link) send(f frame, s *Stream, mode sendMode) bool {
	l.mu.Lock()
	if l.retired {
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
	if mode == sendTry && l.w == nil {
		mode = sendQueue // no raw socket to try
	}
	if mode != sendQueue && !l.writing && l.ui == len(l.urgent) && l.bi == len(l.bulk) && (mode == sendInline || int(f.h.Length) <= l.cfg.SmallFrame) && !l.held() {
		l.writing = true
		l.mu.Unlock()
		// The inline writer's frame, header and iovec live in the link
		// (l.writing makes them its own): on the stack they would escape
		// into the write and cost four allocations per small frame.
		iw := &l.inline
		iw.f = f
		iov := iw.f.appendIOV(iw.a[:0], iw.hb[:])
		var err error
		if mode == sendTry {
			var n int
			n, err = l.w.writev(iov)
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
			_, err = iw.bufs.WriteTo(l.conn)
			l.Stats.InlineSent.Add(1)
		}
		*iw = inlineWrite{} // pins no payload
		l.Stats.Writes.Add(1)
		l.sent(&f)
		l.mu.Lock()
		l.writing = false
		// A link retiring meanwhile waits for its writer to send RETIRE.
		pending := l.ui < len(l.urgent) || l.bi < len(l.bulk) || l.succ != nil
		l.mu.Unlock()
		if err != nil {
			err = fmt.Errorf("relay: write to %v: %w", l.conn.RemoteAddr(), err)
			if mode == sendTry {
				go l.fail(err) // fail runs callbacks; never on the poller thread
			} else {
				l.fail(err)
			}
		} else if pending {
			kick(l.wake)
		}
		return true
	}
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
			l.peer.Name, l.conn.RemoteAddr(), n, l.cfg.MaxControl)
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
func (l *Link) sent(f *frame) {
	l.Stats.FramesSent.Add(1)
	l.notifySent()
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
// let its congestion control measure the path (gateway/prime.go).
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
	for l.bi < len(l.bulk) && len(batch) < l.cfg.MaxBatch && (n == 0 || n+int(l.bulk[l.bi].h.Length) <= l.chunk) {
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
		if l.writing || l.ui == len(l.urgent) && l.bi == len(l.bulk) {
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
		batch = l.take(batch[:0])
		l.mu.Unlock()

		iov = iov[:0]
		for i := range batch {
			iov = batch[i].appendIOV(iov, hdrs[i*header.Size:(i+1)*header.Size])
		}
		// WriteTo consumes its receiver; keep iov's backing array for reuse.
		w := iov
		_, err := w.WriteTo(l.conn)
		l.Stats.Writes.Add(1)
		for i := range batch {
			l.sent(&batch[i])
			batch[i] = frame{}
		}
		if err != nil {
			l.fail(fmt.Errorf("relay: write to %v: %w", l.conn.RemoteAddr(), err))
			return
		}
		l.mu.Lock()
		l.writing = false
	}
}

// MaxHold is the longest a Hold lasts: well under any DeadAfter, so a
// held link never looks dead to its peer.
const MaxHold = time.Second

// WatchSend arms a one-shot signal: the next frame the link sends after
// the call makes a non-blocking send on c. A sampler that has seen the link
// quiet (nothing sent, nothing in flight) can then sleep until it sends
// again instead of polling it. A later call replaces the watch.
func (l *Link) WatchSend(c chan<- struct{}) { l.sendWatch.Store(&c) }

func (l *Link) notifySent() {
	if l.sendWatch.Load() == nil {
		return
	}
	if c := l.sendWatch.Swap(nil); c != nil {
		select {
		case *c <- struct{}{}:
		default:
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

// writeRetire ends the writer of a link that has a successor, called with
// l.mu held and the queues empty: RETIRE is the last frame on the link, so
// the peer has every frame written before it.
func (l *Link) writeRetire(hb []byte) {
	l.retired = true
	l.writing = true // for good: anything sent from now on goes to succ
	l.mu.Unlock()
	header.Header{Type: header.TypeRetire}.Encode(hb)
	if _, err := l.conn.Write(hb); err != nil {
		l.fail(fmt.Errorf("relay: write to %v: %w", l.conn.RemoteAddr(), err))
		return
	}
	l.Stats.FramesSent.Add(1)
	l.notifySent()
	l.retireSent.Store(true)
	l.retireDone()
}

// retire makes succ this link's successor (see Link.succ); false when the
// link had already closed or retired.
func (l *Link) retire(succ *Link) bool {
	l.mu.Lock()
	if l.closed || l.succ != nil {
		l.mu.Unlock()
		return false
	}
	l.succ = succ
	l.mu.Unlock()
	kick(l.wake)
	return true
}

// Renews reports whether the trunk added l in place of a live link that it
// retired (a renewal). The retired link may have closed already: it ends
// as soon as RETIRE has crossed both ways.
func (l *Link) Renews() bool { return l.renews.Load() }

// Retiring reports whether the link has a successor and is ending.
func (l *Link) Retiring() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.succ != nil
}

// ErrLinkRetired is the Err of a link that a renewal replaced.
var ErrLinkRetired = errors.New("relay: link retired (renewed)")

// errPeerRetired stops the reader at the peer's RETIRE.
var errPeerRetired = errors.New("relay: peer retired the link")

// retireDone closes the link once RETIRE has crossed both ways.
func (l *Link) retireDone() {
	if !l.retireSent.Load() || !l.peerRetired.Load() {
		return
	}
	l.closeOnce.Do(func() {
		cbs := l.closing(ErrLinkRetired)
		close(l.done)
		l.w.cancel()
		l.conn.Close() // no linger 0: our RETIRE may still be in the socket
		l.log.Debug("link retired", "peer", l.peer.Name, "link", l.index, "remote", l.conn.RemoteAddr().String())
		for _, f := range cbs {
			f(ErrLinkRetired)
		}
	})
}

// readEnd ends the reader: at the peer's RETIRE cleanly, else by failing
// the link.
func (l *Link) readEnd(err error) {
	if err != errPeerRetired {
		l.fail(readErr(err))
		return
	}
	l.peerRetired.Store(true)
	l.retireDone()
	if !l.Retiring() && l.t.dialer {
		// The acceptor replaced a link we still use, which happens only
		// when our side of that renewal failed: renew again.
		l.t.askRenew()
	}
}

// RequestRenew asks the peer, which dials this link, to renew it (RENEW),
// at most once per renewGap; false when it was not sent.
func (l *Link) RequestRenew(renewGap time.Duration) bool {
	now := time.Now().UnixNano()
	last := l.renewAsked.Load()
	if l.t.dialer || !l.renewable() || now-last < int64(renewGap) || !l.renewAsked.CompareAndSwap(last, now) {
		return false
	}
	return l.enqueue(frame{h: header.Header{Type: header.TypeRenew}}, nil)
}

// renewable: the link is an express link of a trunk whose peer renews.
func (l *Link) renewable() bool {
	return l.express && l.t.lanes && l.peer.Features&header.FeatureRenew != 0
}

// errPeerClosed is a link whose peer closed the connection between frames.
var errPeerClosed = errors.New("relay: peer closed the link")

// readErr names a clean end of the link's byte stream.
func readErr(err error) error {
	if err == io.EOF {
		return errPeerClosed
	}
	return err
}

func (l *Link) readLoop() {
	defer l.w.close()
	r := l.r
	for {
		if l.w != nil && !l.bulk1 && r.Buffered() == 0 && r.Remaining() == 0 {
			// Nothing buffered: if the socket is empty too, the poller
			// thread waits for it and reads while frames arrive whole.
			_, err := r.FillFrom(l.w.read)
			if err == errWouldBlock && l.w.wait() {
				if l.rerr != nil {
					l.readEnd(l.rerr)
					return
				}
				continue
			}
			if err != nil && err != errWouldBlock {
				l.readEnd(err)
				return
			}
		}
		h, err := r.Next()
		if err == nil {
			err = l.handle(r, h)
		}
		if err != nil {
			l.readEnd(err)
			return
		}
	}
}

// readStep runs on the poller thread when the idle link becomes readable:
// it handles every frame that has arrived whole and hands a partial one
// (a large DATA, or one still arriving) back to readLoop.
func (l *Link) readStep() bool {
	r := l.r
	for {
		room := r.Room()
		n, err := r.FillFrom(l.w.read)
		if err == errWouldBlock {
			break
		}
		if err != nil {
			l.rerr = readErr(err)
			return false
		}
		for r.FrameBuffered() {
			h, err := r.Next()
			if err == nil {
				l.Stats.PollRecv.Add(1)
				err = l.handle(r, h)
			}
			if err != nil {
				l.rerr = err
				return false
			}
		}
		if n == 0 || n < room { // no room (a frame larger than the buffer), or the socket is drained
			break
		}
	}
	return r.Buffered() == 0
}

// handle processes one received frame whose header r has just read.
func (l *Link) handle(r *header.Reader, h header.Header) error {
	l.lastRecv.Store(time.Now().UnixNano())
	l.Stats.FramesRecv.Add(1)
	l.bulk1 = false
	if h.Type == header.TypeData || h.Type == header.TypeDataAt {
		l.bulk1 = int(h.Length) > l.cfg.SmallFrame
		return l.recvData(r, h)
	}
	if h.Type == header.TypePad {
		if l.peer.Features&header.FeaturePad == 0 {
			return fmt.Errorf("relay: protocol error from %v: PAD from a peer without feature PAD", l.conn.RemoteAddr())
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
		return fmt.Errorf("relay: protocol error from %v: %w", l.conn.RemoteAddr(), err)
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
		return fmt.Errorf("relay: protocol error from %v: stream %d sent %d bytes beyond its window", l.conn.RemoteAddr(), h.Stream, n)
	}
	p := getBuf(n)
	if err := readPayload(r, *p); err != nil {
		putBuf(p)
		return err
	}
	l.Stats.BytesRecv.Add(uint64(n))
	if err := s.pushAt(off, at, p); err == errEarly {
		s.Reset(header.CodeLimit)
		l.limited("early_data", fmt.Errorf("relay: peer %s: stream %d reset: its DATA would pass the %d bytes buffered for streams whose destination is not connected yet",
			l.peer.Name, h.Stream, l.cfg.MaxEarly))
		return nil
	} else if err != nil {
		return fmt.Errorf("relay: protocol error from %v: stream %d: %w", l.conn.RemoteAddr(), h.Stream, err)
	}
	return nil
}

func (l *Link) dispatch(h header.Header, p []byte) error {
	switch h.Type {
	case header.TypeOpen:
		if h.Stream == 0 || h.Stream&1 == l.t.nextID&1 {
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
		if rtt := time.Now().UnixNano() - t; t != 0 && rtt > 0 { // t is 0 for flush markers
			l.Stats.RTT.Store(rtt)
		}
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

func (l *Link) keepalive() {
	t := time.NewTimer(OnGrid(l.cfg.PingInterval))
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case now := <-t.C:
			t.Reset(OnGrid(l.cfg.PingInterval))
			if silent := now.Sub(time.Unix(0, l.lastRecv.Load())); silent > l.cfg.DeadAfter {
				l.fail(fmt.Errorf("relay: peer %v silent for %v", l.conn.RemoteAddr(), silent.Round(time.Millisecond)))
				return
			}
			f := frame{h: header.Header{Type: header.TypePing, Length: 8}}
			header.PutU32(f.ctl[:4], uint32(uint64(now.UnixNano())>>32))
			header.PutU32(f.ctl[4:], uint32(now.UnixNano()))
			l.enqueue(f, nil)
		}
	}
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
				putBuf(f.buf)
				f.s.returnToken()
			}
		}
		l.urgent, l.bulk, l.ui, l.bi, l.ctlQueued = nil, nil, 0, 0, 0
		l.mu.Unlock()
		close(l.done)
		l.w.cancel() // before the socket closes: its number may be reused
		if tc, ok := l.conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // the peer learns at once, even with data queued
		}
		l.conn.Close()
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
		l.log.Info("link down", "peer", l.peer.Name, "link", l.index, "remote", l.conn.RemoteAddr().String(),
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
