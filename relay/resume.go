package relay

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/seal"
)

// WAN resume (HELLO feature RESUME, docs/wire-format.md).
//
// A link whose connection breaks (a reset, a middlebox timeout, a peer
// silent for DeadAfter) keeps its streams: it is *down*, not failed. Each
// side numbers the bytes of the link it writes (frames whole, headers
// included) and keeps every frame it wrote in a replay list until the peer
// ACKs it; the reader counts the bytes of the frames it has handled. The
// dialer connects again with a HELLO that names the link's session and
// the bytes it has received; the acceptor answers with its own count; each
// side then writes its replay list from the byte the other has, ahead of
// anything queued since, and the link carries on. A frame is handled
// whole or not at all, so both counts always fall on frame boundaries: no
// byte is lost and none is delivered twice. Streams see a pause.
//
// The replay list holds the pooled payload buffers of the frames it keeps
// (no copy), at most ReplayMax bytes of bulk: past that the writer takes
// no more bulk frames until an ACK frees room (control frames and small
// DATA still go, so ACKs always cross). A link down for longer than
// ResumeWithin fails as a link without resume does: its streams are reset.

// resumer is a resuming link's state beside the link's own.
type resumer struct {
	local  uint64 // the session this side gave the link (HELLO)
	max    int64  // Config.ReplayMax
	within time.Duration
	every  uint64 // received bytes between two ACKs (at most)

	mu      sync.Mutex
	replay  []frame // written, not yet acknowledged, in order
	ri      int     // replay[:ri] are freed
	sendSeq uint64  // link bytes written, as frames
	acked   uint64  // link bytes the peer has acknowledged
	bytes   atomic.Int64

	recvSeq atomic.Uint64 // link bytes received in frames handled whole
	ackSent atomic.Uint64 // recvSeq as the last ACK carried it
	unacked atomic.Int32  // frames received since the last ACK
	ackAt   atomic.Int64  // when the last ACK was queued (unix ns)

	// Under Link.mu: when the link went down and why, and the channel
	// the current connection's reader closes when it returns.
	downAt     time.Time
	downErr    error
	readerDone chan struct{}
	breaks     chan struct{} // a signal per break (Link.Breaks)

	resumedAt atomic.Int64  // unix ns of the last resume (stale PONGs)
	Resumes   atomic.Uint64 // after breaks
	Renewals  atomic.Uint64 // resumes of a working link on purpose (ErrRenewal)
	Replayed  atomic.Uint64 // bytes written again after resumes and renewals
}

func newResumer(cfg *Config, local uint64) *resumer {
	return &resumer{local: local, max: cfg.ReplayMax, within: cfg.ResumeWithin,
		every:      uint64(min(max(cfg.ReplayMax/8, 64<<10), 1<<20)),
		readerDone: make(chan struct{}), breaks: make(chan struct{}, 1)}
}

// ResumeStats are a resuming link's counters.
type ResumeStats struct {
	Resumes      uint64 // connections the link continued on after a break
	Renewals     uint64 // connections it continued on for a renewal (Pause, ErrRenewal)
	Replayed     uint64 // bytes written again after resumes and renewals
	ReplayBytes  int64  // bytes held for the peer's ACK now
	Sent, Acked  uint64 // link bytes written, and acknowledged by the peer
	Received     uint64 // link bytes received in whole frames
	DownFor      time.Duration
	Down, Enable bool
}

// ResumeStats reports the link's resume state (zero without resume).
func (l *Link) ResumeStats() ResumeStats {
	r := l.rs
	if r == nil {
		return ResumeStats{}
	}
	st := ResumeStats{Enable: true, Resumes: r.Resumes.Load(), Renewals: r.Renewals.Load(), Replayed: r.Replayed.Load(),
		ReplayBytes: r.bytes.Load(), Received: r.recvSeq.Load()}
	r.mu.Lock()
	st.Sent, st.Acked = r.sendSeq, r.acked
	r.mu.Unlock()
	l.mu.Lock()
	if l.broken {
		st.Down, st.DownFor = true, time.Since(r.downAt)
	}
	l.mu.Unlock()
	return st
}

// Resumable reports whether the link resumes after a break (both sides set
// HELLO feature RESUME and gave it a session).
func (l *Link) Resumable() bool { return l.rs != nil }

// Down reports whether the link's connection broke and the link waits to
// be resumed.
func (l *Link) Down() bool { return l.down.Load() }

// Breaks signals once per break of a resuming link's connection (buffered:
// a break while nobody listens is kept); the dialing side then connects
// again and calls Resume.
func (l *Link) Breaks() <-chan struct{} {
	if l.rs == nil {
		return nil
	}
	return l.rs.breaks
}

// keep puts a frame about to be written on the replay list, which then
// owns its pooled payload, before its first byte can reach the peer (and
// be acknowledged). Called in the order frames go on the wire (one writer
// at a time); a frame kept before (the rest of a partial write) is not
// kept again.
func (l *Link) keep(f *frame) {
	if f.kept {
		return
	}
	f.kept = true
	r := l.rs
	k := frame{h: f.h, ctl: f.ctl, body: f.body, buf: f.buf, replayed: true}
	n := f.wireLen()
	r.mu.Lock()
	k.seq = r.sendSeq
	r.sendSeq += uint64(n)
	r.replay = append(r.replay, k)
	r.mu.Unlock()
	r.bytes.Add(held(&k))
}

// held is the memory a kept frame pins: its pooled buffer's size class
// (a 1-byte message holds 512 bytes), not only its bytes on the wire.
func held(f *frame) int64 {
	if f.buf != nil {
		return int64(header.Size + header.DataAtPrefix + cap(*f.buf))
	}
	return int64(f.wireLen())
}

// replayRoom: the writer may take bulk frames (the replay list is below
// ReplayMax).
func (l *Link) replayRoom() bool { return l.rs == nil || l.rs.bytes.Load() < l.rs.max }

// acked frees the frames the peer has received (ACK of n link bytes).
func (l *Link) acked(n uint64) error {
	r := l.rs
	if r == nil {
		return errors.New("ACK on a link without resume")
	}
	r.mu.Lock()
	if n > r.sendSeq {
		sent := r.sendSeq
		r.mu.Unlock()
		return fmt.Errorf("ACK of %d bytes of the link, %d written", n, sent)
	}
	if n <= r.acked {
		// An ACK written before a resume and replayed after it: the
		// resuming HELLO acknowledged more.
		r.mu.Unlock()
		return nil
	}
	r.acked = n
	var freed int64
	for r.ri < len(r.replay) {
		f := &r.replay[r.ri]
		if f.seq+uint64(f.wireLen()) > n {
			break
		}
		freed += held(f)
		putBuf(f.buf)
		*f = frame{}
		r.ri++
	}
	if r.ri == len(r.replay) {
		// All acknowledged: a list that grew large in a burst is dropped,
		// so an idle link does not keep it.
		if cap(r.replay) > 512 {
			r.replay = nil
		}
		r.replay, r.ri = r.replay[:0], 0
	} else if r.ri >= 256 && r.ri >= len(r.replay)/2 {
		r.replay = r.replay[:copy(r.replay, r.replay[r.ri:])]
		r.ri = 0
	}
	r.mu.Unlock()
	if freed > 0 && r.bytes.Add(-freed)+freed >= r.max {
		kick(l.wake) // the writer may take bulk again
	}
	return nil
}

// received counts a frame the reader has handled whole and acknowledges
// every ReplayMax/8 bytes (64 KiB to 1 MiB) or ackFrames frames, so the
// peer's replay list, and the pooled buffers it pins, stay small (freed
// buffers go back to the pool: a message path keeps reusing them).
func (l *Link) received(h header.Header) {
	r := l.rs
	n := r.recvSeq.Add(uint64(header.Size) + uint64(h.Length))
	if r.unacked.Add(1) >= ackFrames || n-r.ackSent.Load() >= r.every {
		l.sendAck(n)
	}
}

// ackFrames is the most frames received between two ACKs.
const ackFrames = 128

// tickAck acknowledges, with a keepalive, what arrived since the last ACK
// if that is more than the keepalives themselves (the peer's PING and the
// PONG to ours), or if it has waited ackIdle: an idle link then writes no
// ACK of its own every second.
func (l *Link) tickAck(now time.Time) {
	r := l.rs
	n := r.recvSeq.Load()
	if n == r.ackSent.Load() {
		return
	}
	if r.unacked.Load() > 2 || now.UnixNano()-r.ackAt.Load() >= int64(ackIdle) {
		l.sendAck(n)
	}
}

// ackIdle is the longest a keepalive leaves received frames unacknowledged.
const ackIdle = 30 * time.Second

func (l *Link) sendAck(n uint64) {
	l.rs.unacked.Store(0)
	l.rs.ackAt.Store(time.Now().UnixNano())
	l.rs.ackSent.Store(n)
	f := frame{h: header.Header{Type: header.TypeAck, Length: 8}}
	header.PutU64(f.ctl[:], n)
	l.enqueue(f, nil)
}

// release frees the replay list of a link that failed.
func (r *resumer) release() {
	r.mu.Lock()
	for i := r.ri; i < len(r.replay); i++ {
		putBuf(r.replay[i].buf)
	}
	r.replay, r.ri = nil, 0
	r.mu.Unlock()
	r.bytes.Store(0)
}

// rewind takes back the frames from link byte n on, for writing again on
// a new connection, and frees those before it.
func (r *resumer) rewind(n uint64) ([]frame, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n < r.acked || n > r.sendSeq {
		return nil, fmt.Errorf("the peer resumes at byte %d of the link; this side holds bytes %d to %d", n, r.acked, r.sendSeq)
	}
	i := r.ri
	for ; i < len(r.replay) && r.replay[i].seq < n; i++ {
		f := &r.replay[i]
		if f.seq+uint64(f.wireLen()) > n {
			return nil, fmt.Errorf("the peer resumes at byte %d of the link, inside a %v frame at %d", n, f.h.Type, f.seq)
		}
		putBuf(f.buf)
	}
	if i == len(r.replay) && n != r.sendSeq {
		return nil, fmt.Errorf("the peer resumes at byte %d of the link; this side holds bytes %d to %d", n, r.acked, r.sendSeq)
	}
	again := slices.Clone(r.replay[i:])
	clear(r.replay)
	r.replay, r.ri = r.replay[:0], 0
	r.sendSeq, r.acked = n, n
	r.bytes.Store(0)
	return again, nil
}

// isBreak tells a broken connection (which a resuming link survives) from
// a peer that broke the protocol or ended the link (which fails it). A
// peer's FIN between frames is an end: a gateway closes a link only when
// it fails it or exits, and either way keeps nothing to resume; resets,
// timeouts and silence are what networks do to connections.
func isBreak(err error) bool {
	if errors.Is(err, errPeerClosed) {
		return false
	}
	var ne net.Error
	var errno syscall.Errno
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) ||
		errors.As(err, &errno) || errors.Is(err, errSilent) || errors.Is(err, errBreak) ||
		seal.IsRecordError(err) // bytes altered on the path, as a TLS record's tag failure was
}

// errBreak marks a connection ended on purpose for a resume (Break).
var errBreak = errors.New("relay: connection broken for a resume")

// resetSeen reports whether an end of file on conn follows a reset rather
// than the peer's FIN: a socket reports a reset once, to whichever call
// comes first (often the writer's), and reads return end of file after it.
// The TCP state tells: CLOSE after a reset, CLOSE_WAIT after a FIN.
func resetSeen(conn net.Conn, err error) bool {
	sc, ok := conn.(syscall.Conn)
	if !errors.Is(err, errPeerClosed) || !ok {
		return false
	}
	rc, rerr := sc.SyscallConn()
	if rerr != nil {
		return false
	}
	var state uint8
	rc.Control(func(fd uintptr) {
		if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = ti.State
		}
	})
	return state == tcpClose
}

// tcpClose is the kernel's TCP_CLOSE state (include/net/tcp_states.h).
const tcpClose = 7

// errSilent: the peer sent nothing for DeadAfter.
var errSilent = errors.New("relay: peer silent")

// broke handles the failure of connection generation gen: a resuming link
// goes down and waits for Resume, any other fails. An error from an older
// connection than the current one is stale and ignored.
func (l *Link) broke(gen uint64, err error) {
	l.mu.Lock()
	if l.closed || gen != l.gen || l.broken {
		l.mu.Unlock()
		return
	}
	if l.rs == nil || l.succ != nil || l.retired || !isBreak(err) && !resetSeen(l.conn, err) {
		l.mu.Unlock()
		l.fail(err)
		return
	}
	conn, rd := l.goDown(err)
	if sc, ok := conn.(*SealedConn); ok && seal.IsRecordError(err) && !errors.Is(err, seal.ErrAlert) {
		// An orderly close after the alert: a reset could discard it.
		sc.alert()
	} else if tc := TCPOf(conn); tc != nil {
		tc.SetLinger(0)
	}
	conn.Close()
	rd.stop()
	renewal := errors.Is(err, ErrRenewal)
	if renewal {
		l.log.Debug("WAN link renewal: the old connection ends", "peer", l.peer.Name, "link", l.index, "remote", l.remoteAddr())
	} else {
		l.log.Warn("WAN link broken; its streams wait for it to resume", "peer", l.peer.Name, "link", l.index,
			"remote", l.remoteAddr(), "within", l.rs.within, "err", err)
	}
	select {
	case l.rs.breaks <- struct{}{}:
	default:
	}
	if renewal {
		return // the link resumes at once: no stream needs to move
	}
	if ss := l.t.broken(l); len(ss) > 0 {
		for _, s := range ss {
			s.Reset(header.CodeLinkLost)
		}
		l.log.Info("streams that resume without the link reset", "peer", l.peer.Name, "link", l.index, "streams", len(ss))
	}
}

// goDown marks the resuming link down for err, with l.mu held, which it
// releases, and takes its socket back from the poller thread before the
// caller closes it or times it out (its number may be reused). It returns
// the connection and its reader, which the caller ends.
func (l *Link) goDown(err error) (net.Conn, *linkReader) {
	l.broken = true
	l.down.Store(true)
	l.rs.downAt, l.rs.downErr = time.Now(), err
	conn, w, rd := l.conn, l.w, l.rd
	l.mu.Unlock()
	w.cancel()
	return conn, rd
}

// Break ends the link's connection as a failure would, so that a new one
// can resume the link: the acceptor calls it when the dialer resumes a link
// whose break this side has not seen yet.
func (l *Link) Break(err error) {
	l.mu.Lock()
	gen := l.gen
	l.mu.Unlock()
	l.broke(gen, fmt.Errorf("%w: %w", errBreak, err))
}

// ErrRenewal, wrapped in the error given to Break, ends a working link's
// connection for a renewal: the peer resumes the link on a new connection
// at once (HELLO renew flag), so the break is logged as routine and no
// stream is moved elsewhere (Stream.ResetOnBreak).
var ErrRenewal = errors.New("relay: link renewed on a new connection")

// Pause takes a working resumable link down without touching its
// connection, so that a new connection can resume it (ResumeHello, then
// Resume): the dialer renews a link this way. Its reader and writer stop
// at once, wherever they wait, and the count of bytes received is final
// when ResumeHello returns. Nothing reaches the peer: a reset or FIN
// would, ahead of the HELLO that tells it the link is being renewed, and
// would look like a failure there. The old connection closes when the
// link resumes or fails. Pause on a link that is already down does nothing.
func (l *Link) Pause() error {
	if l.rs == nil {
		return errors.New("relay: the link does not resume")
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.closedErr()
	}
	if l.broken {
		l.mu.Unlock()
		return nil
	}
	conn, rd := l.goDown(ErrRenewal)
	// A deadline in the past ends every read and write on the socket,
	// blocking or not (the poller's raw reads check it too); the errors
	// they return come from an old generation or a broken link, and are
	// ignored (broke).
	conn.SetDeadline(time.Unix(1, 0))
	rd.stop()
	l.log.Debug("WAN link paused for a renewal", "peer", l.peer.Name, "link", l.index, "remote", l.remoteAddr())
	return nil
}

// errNotDown: Resume or ResumeHello on a link that is not down.
var errNotDown = errors.New("relay: the link is not down")

// waitReader waits until the broken connection's reader has returned, so
// the count of bytes received is final.
func (l *Link) waitReader() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.closedErr()
	}
	if !l.broken {
		l.mu.Unlock()
		return errNotDown
	}
	rd := l.rs.readerDone
	l.mu.Unlock()
	select {
	case <-rd:
		return nil
	case <-l.done:
		return l.closedErr()
	}
}

// ResumeHello returns h carrying the link's session, the resume flag and
// the bytes this side has received: the HELLO of a connection that is to
// continue the link. The link must be down.
func (l *Link) ResumeHello(h header.Hello) (header.Hello, error) {
	if l.rs == nil {
		return h, errors.New("relay: the link does not resume")
	}
	if err := l.waitReader(); err != nil {
		return h, err
	}
	h.Features |= header.FeatureResume
	h.Session, h.Resume, h.Received = l.rs.local, true, l.rs.recvSeq.Load()
	return h, nil
}

// Session is the session the peer gave the link in its first HELLO (0
// without resume): a HELLO to resume the link names it.
func (l *Link) Session() uint64 {
	if l.rs == nil {
		return 0
	}
	return l.peer.Session
}

// Resume continues the down link on conn, whose HELLO exchange resumed it
// (peer is the peer's HELLO, with the bytes it has received): the frames
// the peer lacks are written again first, then what waited in the queues.
// An error leaves the link failed when the two sides' counts cannot meet,
// and down otherwise; conn is the caller's to close either way.
func (l *Link) Resume(conn net.Conn, peer header.Hello) error {
	if l.rs == nil {
		return errors.New("relay: the link does not resume")
	}
	if !peer.Resume || peer.Session != l.peer.Session {
		return fmt.Errorf("relay: HELLO resumes session %#x, the link's is %#x", peer.Session, l.peer.Session)
	}
	if err := l.waitReader(); err != nil {
		return err
	}
	l.mu.Lock()
	for l.writing && !l.closed {
		// A writer still returning from the broken socket's error: its
		// frames must reach the replay list before it is rewound.
		l.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		l.mu.Lock()
	}
	if l.closed || !l.broken {
		l.mu.Unlock()
		if l.closed {
			return l.closedErr()
		}
		return errNotDown
	}
	again, err := l.rs.rewind(peer.Received)
	if err != nil {
		l.mu.Unlock()
		err = fmt.Errorf("relay: cannot resume link %d to %s: %w", l.index, l.peer.Name, err)
		l.fail(err)
		return err
	}
	// A frame the poller thread wrote in part on the old socket is on the
	// replay list (kept before its first byte): it goes again whole from
	// there, and its queued rest is done with.
	for i := l.ui; i < len(l.urgent); {
		if f := &l.urgent[i]; f.kept {
			if !f.isData() {
				l.ctlQueued--
			}
			l.sent(f)
			l.urgent = slices.Delete(l.urgent, i, i+1)
			continue
		}
		i++
	}
	var bytes uint64
	for i := range again {
		bytes += uint64(again[i].wireLen())
		if !again[i].isData() {
			l.ctlQueued++
		}
	}
	l.urgent = slices.Insert(l.urgent, l.ui, again...)
	old := l.conn
	l.conn = conn
	l.remote.Store(conn.RemoteAddr())
	l.watchConn(conn)
	l.gen++
	rd := l.newReader(conn, l.gen)
	l.tail = false // the old connection's
	l.bulk1 = false
	l.broken = false
	l.down.Store(false)
	downFor := time.Since(l.rs.downAt)
	renewal := errors.Is(l.rs.downErr, ErrRenewal)
	l.rs.readerDone = rd.done
	l.lastRecv.Store(time.Now().UnixNano())
	l.mu.Unlock()
	// A break closed the old connection already; a Pause left it open.
	if tc := TCPOf(old); tc != nil {
		tc.SetLinger(0) // what it still queues is replayed here
	}
	old.Close()
	l.rs.resumedAt.Store(time.Now().UnixNano())
	l.rs.ackSent.Store(l.rs.recvSeq.Load()) // the peer learnt it from our HELLO
	l.rs.Replayed.Add(bytes)
	rd.start()
	kick(l.wake)
	lvl, msg := slog.LevelInfo, "WAN link resumed"
	if renewal {
		l.rs.Renewals.Add(1)
		lvl, msg = slog.LevelDebug, "WAN link renewed"
	} else {
		l.rs.Resumes.Add(1)
	}
	l.log.Log(context.Background(), lvl, msg, "peer", l.peer.Name, "link", l.index, "remote", conn.RemoteAddr().String(),
		"down_for", downFor.Round(time.Millisecond), "replayed_bytes", bytes, "frames", len(again))
	return nil
}

// remoteAddr is the current connection's peer address, for messages.
func (l *Link) remoteAddr() string {
	if a, ok := l.remote.Load().(net.Addr); ok && a != nil {
		return a.String()
	}
	return "?"
}
