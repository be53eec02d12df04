package node

// Resumable connections (docs/wire-format.md, "Resumable streams"). The
// daemons at both ends of a rank's connection frame its bytes in records
// and keep what they sent until the other daemon acknowledges it, so a
// connection outlives the gateway hosts that carry it: when its stream
// breaks, the opening daemon opens another through any gateway of its
// site, with the same resume id, and both ends go on from what the other
// received. The accepting daemon waits for it (Config.Hold).
//
// A stream's reader never waits for the rank: it queues the bytes it
// takes for a writer of their own, so an acknowledgement behind them is
// read at once. Acknowledging only what the rank took bounds that queue
// by the sender's window; reading it in order behind bytes that wait for
// a rank that waits for its own window to open would deadlock both.

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/relay"
)

// The records on a resumable stream are header's (header/resume.go);
// maxRecord also sizes the stream's reader and the reads from the rank.
const maxRecord = header.MaxResumeData

var errResumeReset = errors.New("the other node daemon reset the connection")

// session is one resumable connection: the rank's socket c and the stream
// that carries it now. Offsets count the bytes of each direction, and a
// FIN one more.
type session struct {
	d      *Daemon
	id     header.ResumeID
	c      *net.TCPConn
	rank   relay.TCPConn // c, for writes that do not wait (TryWrite)
	opener bool
	// redial opens a new stream for the connection (opener only): OPEN
	// with the id written and the gateway's verdict read.
	redial func(ctx context.Context) (*mx.Stream, error)

	mu sync.Mutex
	// Each waiter has a condition of its own, so waking one costs no
	// other goroutine a wake-up: sendCond the current stream's writer,
	// deliverCond toRank, windowCond fromRank.
	sendCond, deliverCond, windowCond *sync.Cond
	// Toward the peer.
	segs []seg  // sent, not acknowledged: [una, end)
	una  uint64 // first offset the peer has not acknowledged
	end  uint64 // next offset the rank's bytes take
	eof  bool   // the rank ended its writes: FIN at end
	// From the peer: rcv offsets received, of which dlv are written to
	// the rank and rq waits (a nil entry is the FIN).
	rcv, dlv uint64
	rq       [][]byte
	// delivering: a write to the rank is under way (toRank's, or a
	// reader's that found nothing queued); the next waits for it.
	delivering bool
	peerFin    bool // the FIN is written (the rank's socket half closed)
	// ackSent is dlv as last sent to the peer; ackTimer sends a delayed
	// one.
	ackSent  uint64
	ackTimer *time.Timer
	known    bool // opener: the acceptor has answered
	p        *path
	gen      int           // streams attached so far
	ready    chan struct{} // acceptor: closed once c is connected (or failed)
	err      error         // the connection is over
	over     chan struct{}
	finished bool // both directions ended and acknowledged
}

// seg is one record of the rank's bytes, header included: written as is.
type seg struct {
	off uint64 // offset of the first data byte
	b   []byte // DATA header, then the bytes
}

type path struct {
	s *mx.Stream
	// wmu orders the stream's writers: its writer goroutine, and fromRank
	// sending new bytes itself when nothing waits before them.
	wmu     sync.Mutex
	nxt     uint64 // next offset to send
	ready   bool   // the peer's HELLO is in: nxt is known
	finSent bool
	dead    bool
}

func (d *Daemon) newSession(id header.ResumeID, c *net.TCPConn, opener bool) *session {
	ss := &session{d: d, id: id, opener: opener, over: make(chan struct{})}
	if c != nil {
		ss.setRank(c)
	}
	ss.sendCond, ss.deliverCond, ss.windowCond = sync.NewCond(&ss.mu), sync.NewCond(&ss.mu), sync.NewCond(&ss.mu)
	return ss
}

// setRank sets the rank's connection, once it is known.
func (ss *session) setRank(c *net.TCPConn) { ss.c, ss.rank = c, relay.WrapTCP(c) }

func newResumeID() header.ResumeID {
	var id header.ResumeID
	for id.IsZero() {
		rand.Read(id[:])
	}
	return id
}

// readHello reads the first record of a stream: the other end's HELLO,
// or its RESET (errResumeReset).
func readHello(r *bufio.Reader) (flags byte, rcv, acked uint64, err error) {
	rec, err := header.ReadResumeHello(r)
	if err == nil && rec.Type == header.ResumeReset {
		err = errResumeReset
	}
	return rec.Flags, rec.Received, rec.Acked, err
}

func newRecordReader(s *mx.Stream) *bufio.Reader { return bufio.NewReaderSize(s, maxRecord) }

// run carries the connection until it ends; its first stream is open.
func (ss *session) run(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { ss.fail(ctx.Err(), true) })
	defer stop()
	go ss.fromRank()
	go ss.toRank()
	<-ss.over
	ss.mu.Lock()
	finished, p := ss.finished, ss.p
	ss.mu.Unlock()
	if !ss.opener {
		ss.d.forget(ss.id)
	}
	if finished {
		closeGracefully(ss.c)
		if p != nil {
			// The peer closes its end after the last acknowledgement;
			// a peer that never does is not waited for.
			time.AfterFunc(ss.d.cfg.Hold, func() { p.s.Abort() })
		}
	}
}

// acceptResumable takes a gateway's stream for a resumable connection: a
// new one, which connects to the rank's port, or one that resumes a
// connection the daemon holds.
func (d *Daemon) acceptResumable(ctx context.Context, s *mx.Stream, from, to netip.AddrPort, gw int, id header.ResumeID) {
	r := newRecordReader(s)
	t := time.AfterFunc(d.cfg.FirstFrame, func() { s.Abort() })
	flags, rcv, acked, err := readHello(r)
	t.Stop()
	if err != nil {
		d.cfg.Log.Info("resumable stream from the gateway refused: no HELLO", "err", err)
		s.Abort()
		return
	}
	d.sessMu.Lock()
	ss := d.sessions[id]
	if ss != nil {
		d.sessMu.Unlock()
		select {
		case <-ss.ready:
		case <-ctx.Done():
			s.Abort()
			return
		}
		if ss.takeOver(s, r, rcv, acked) {
			d.resumes.Add(1)
		}
		return
	}
	if flags&header.ResumeKnown != 0 {
		d.sessMu.Unlock()
		// The connection ended here (its hold ran out, or the daemon
		// restarted): the opener resets its rank.
		d.cfg.Log.Info("resumable stream for a connection this daemon does not hold: reset", "dst", to.String())
		refuseResume(s)
		return
	}
	ss = d.newSession(id, nil, false)
	ss.ready = make(chan struct{})
	d.sessions[id] = ss
	d.sessMu.Unlock()
	c, done, err := d.dialRank(ctx, from, to, gw)
	if err != nil {
		d.cfg.Log.Info("rank port unreachable", "dst", to.String(), "err", err)
		ss.err = err
		close(ss.ready)
		d.forget(id)
		refuseResume(s)
		return
	}
	defer done()
	ss.setRank(c)
	close(ss.ready)
	ss.takeOver(s, r, rcv, acked)
	ss.run(ctx)
}

// forget drops an accepted connection that ended: a stream that comes to
// resume it is refused.
func (d *Daemon) forget(id header.ResumeID) {
	d.sessMu.Lock()
	delete(d.sessions, id)
	d.sessMu.Unlock()
}

// refuseResume ends a resumable stream with RESET: the other daemon resets
// its rank.
func refuseResume(s *mx.Stream) {
	s.Write([]byte{byte(header.ResumeReset)})
	s.Close()
}

// takeOver makes s, whose opener announced what it received and
// acknowledged, the accepted connection's stream, and answers with this
// end's figures.
func (ss *session) takeOver(s *mx.Stream, r *bufio.Reader, rcv, acked uint64) bool {
	ss.mu.Lock()
	err := ss.err
	if err == nil {
		err = ss.checkHello(rcv, acked)
	}
	ss.mu.Unlock()
	if err != nil {
		refuseResume(s)
		if !errors.Is(err, io.EOF) {
			ss.fail(err, false)
		}
		return false
	}
	p, hello, ok := ss.switchTo(s, true, rcv, acked, 0)
	if !ok {
		return false
	}
	_, err = s.Write(hello)
	p.wmu.Unlock()
	if err != nil {
		ss.pathFailed(p, err)
		return false
	}
	ss.start(p, r)
	return true
}

// open makes s, just opened through a gateway, the connection's stream
// (opener): this end's HELLO goes first, then the records.
func (ss *session) open(s *mx.Stream) bool {
	ss.mu.Lock()
	flags := byte(0)
	if ss.known {
		flags = header.ResumeKnown
	}
	ss.mu.Unlock()
	p, hello, ok := ss.switchTo(s, false, 0, 0, flags)
	if !ok {
		return false
	}
	_, err := s.Write(hello)
	p.wmu.Unlock()
	if err != nil {
		ss.pathFailed(p, err)
		return false
	}
	ss.start(p, newRecordReader(s))
	return true
}

// switchTo makes s the connection's stream, in place of any other, and
// returns it, its wmu held, with this end's HELLO for it: no byte of the
// stream it replaces is taken after. ready: the peer's HELLO (rcv, acked) is known (acceptor);
// else the reader waits for it.
func (ss *session) switchTo(s *mx.Stream, ready bool, rcv, acked uint64, flags byte) (*path, []byte, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.err != nil {
		s.Abort()
		return nil, nil, false
	}
	if old := ss.p; old != nil {
		old.dead = true
		old.s.Abort()
	}
	p := &path{s: s}
	// Nothing goes on the stream before this end's HELLO: the caller
	// writes it and unlocks.
	p.wmu.Lock()
	if ready {
		ss.peerHello(p, rcv, acked)
	}
	ss.p = p
	ss.gen++
	ss.wakeAll()
	return p, header.AppendResumeHello(nil, flags, ss.rcv, ss.dlv), true
}

// start carries p once this end's HELLO is on it.
func (ss *session) start(p *path, r *bufio.Reader) {
	go ss.write(p)
	go ss.read(p, r)
}

// checkHello refuses a peer's HELLO that claims more than was sent (the
// FIN counts one) or acknowledges less than it did before. Under mu.
func (ss *session) checkHello(rcv, acked uint64) error {
	if rcv > ss.end+1 || acked < ss.una {
		return fmt.Errorf("the other node daemon received %d and acknowledged %d: offsets up to %d were sent, %d acknowledged", rcv, acked, ss.end, ss.una)
	}
	return nil
}

// peerHello takes what the peer received and acknowledged, from its
// HELLO: the path sends from there. Under mu.
func (ss *session) peerHello(p *path, rcv, acked uint64) {
	ss.ack(acked)
	p.nxt = rcv
	p.finSent = ss.eof && p.nxt > ss.end
	p.ready = true
	ss.sendCond.Broadcast()
}

// ack drops what the peer acknowledged. Under mu.
func (ss *session) ack(n uint64) {
	if n <= ss.una {
		return
	}
	ss.una = n
	i := 0
	for i < len(ss.segs) && ss.segs[i].off+uint64(len(ss.segs[i].b)-header.ResumeDataPrefix) <= n {
		i++
	}
	// Move the rest to the front: the array keeps its capacity, and a
	// message per round trip allocates no new one.
	k := copy(ss.segs, ss.segs[i:])
	clear(ss.segs[k:])
	ss.segs = ss.segs[:k]
	ss.windowCond.Broadcast()
	ss.checkDone()
}

// wakeAll wakes every waiter: the connection ended, or its stream
// changed. Under mu.
func (ss *session) wakeAll() {
	ss.sendCond.Broadcast()
	ss.deliverCond.Broadcast()
	ss.windowCond.Broadcast()
}

// checkDone ends the connection once both directions ended and were
// acknowledged. Under mu.
func (ss *session) checkDone() {
	if ss.err == nil && ss.eof && ss.una > ss.end && ss.peerFin && ss.ackSent == ss.dlv {
		ss.finished = true
		ss.err = io.EOF
		ss.wakeAll()
		close(ss.over)
	}
}

// fromRank reads the rank's bytes into records, within the window.
func (ss *session) fromRank() {
	window := uint64(ss.d.cfg.ResumeWindow)
	buf := make([]byte, maxRecord)
	for {
		ss.mu.Lock()
		for ss.err == nil && ss.end-ss.una >= window {
			ss.windowCond.Wait()
		}
		over := ss.err != nil
		ss.mu.Unlock()
		if over {
			return
		}
		n, err := ss.c.Read(buf)
		if n > 0 {
			b := header.AppendResumeData(make([]byte, 0, header.ResumeDataPrefix+n), buf[:n])
			ss.mu.Lock()
			off := ss.end
			ss.segs = append(ss.segs, seg{off: off, b: b})
			ss.end += uint64(n)
			p := ss.p
			ss.mu.Unlock()
			if !ss.sendNow(p, off, b) {
				ss.mu.Lock()
				ss.sendCond.Broadcast()
				ss.mu.Unlock()
			}
		}
		if err == io.EOF {
			ss.mu.Lock()
			ss.eof = true
			ss.sendCond.Broadcast()
			ss.mu.Unlock()
			return
		}
		if err != nil {
			ss.fail(fmt.Errorf("rank connection: %w", err), true)
			return
		}
	}
}

// sendNow writes the record b at offset off on p from the rank's reader
// itself when nothing waits before it, saving the writer goroutine's
// wake-up per message; else (or if p is nil) it reports false and the
// writer sends it.
func (ss *session) sendNow(p *path, off uint64, b []byte) bool {
	if p == nil {
		return false
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	ss.mu.Lock()
	if ss.p != p || p.dead || !p.ready || p.nxt != off || ss.err != nil {
		ss.mu.Unlock()
		return false
	}
	p.nxt = off + uint64(len(b)-header.ResumeDataPrefix)
	var ack []byte
	if ss.dlv != ss.ackSent && ss.ackDue() {
		ack = header.AppendResumeAck(nil, ss.dlv)
		ss.ackSent = ss.dlv
	}
	ss.mu.Unlock()
	var err error
	if ack != nil {
		_, err = p.s.Write(ack)
	}
	if err == nil {
		_, err = p.s.Write(b)
	}
	if err != nil {
		go ss.pathFailed(p, err)
	}
	return true
}

// toRank writes what the streams received to the rank, in order.
func (ss *session) toRank() {
	for {
		ss.mu.Lock()
		for ss.err == nil && (len(ss.rq) == 0 || ss.delivering) {
			ss.deliverCond.Wait()
		}
		if ss.err != nil {
			ss.mu.Unlock()
			return
		}
		b := ss.rq[0]
		k := copy(ss.rq, ss.rq[1:])
		ss.rq[k] = nil
		ss.rq = ss.rq[:k]
		ss.delivering = true
		ss.mu.Unlock()
		var err error
		if b == nil {
			err = ss.c.CloseWrite()
		} else {
			_, err = ss.c.Write(b)
		}
		if err != nil {
			ss.fail(fmt.Errorf("rank connection: %w", err), true)
			return
		}
		ss.mu.Lock()
		ss.delivering = false
		if b == nil {
			ss.dlv++
			ss.peerFin = true
			ss.sendCond.Broadcast() // the FIN is acknowledged at once
		} else {
			ss.dlv += uint64(len(b))
			ss.ackLater()
		}
		ss.mu.Unlock()
	}
}

// ackLater schedules the acknowledgement of what the rank took. Under mu.
func (ss *session) ackLater() {
	if ss.dlv-ss.ackSent >= uint64(ss.d.cfg.ResumeWindow/4) {
		ss.sendCond.Broadcast()
	} else if ss.ackTimer == nil {
		// While the timer runs, ackDue waits for it.
		ss.ackTimer = time.AfterFunc(ackDelay, func() {
			ss.mu.Lock()
			ss.ackTimer = nil
			ss.sendCond.Broadcast()
			ss.mu.Unlock()
		})
	}
}

// ackDelay bounds how long delivered bytes go unacknowledged when the
// rank's own bytes carry no acknowledgement back.
const ackDelay = 20 * time.Millisecond

// write sends on p what the peer has not received, and acknowledgements.
func (ss *session) write(p *path) {
	var out [][]byte
	var ctl []byte
	for {
		ss.mu.Lock()
		for ss.err == nil && !p.dead && !ss.sendable(p) {
			ss.sendCond.Wait()
		}
		if p.dead || ss.err != nil && !ss.finished {
			ss.mu.Unlock()
			return
		}
		// fromRank may be sending: take the stream, then look again.
		ss.mu.Unlock()
		p.wmu.Lock()
		ss.mu.Lock()
		out, ctl = out[:0], ctl[:0]
		if p.ready && ss.dlv != ss.ackSent && ss.ackDue() {
			ctl = header.AppendResumeAck(ctl, ss.dlv)
			ss.ackSent = ss.dlv
		}
		size := 0
		if p.ready {
			for _, sg := range ss.segs {
				n := uint64(len(sg.b) - header.ResumeDataPrefix)
				if sg.off+n <= p.nxt {
					continue
				}
				b := sg.b
				if skip := p.nxt - sg.off; skip > 0 {
					// The peer has the start of this record (a resumed
					// stream): a record of the rest.
					rest := sg.b[header.ResumeDataPrefix+skip:]
					b = header.AppendResumeData(make([]byte, 0, header.ResumeDataPrefix+len(rest)), rest)
				}
				out = append(out, b)
				p.nxt = sg.off + n
				if size += len(b); size >= 4*maxRecord {
					break
				}
			}
			if ss.eof && !p.finSent && p.nxt == ss.end {
				out = append(out, []byte{byte(header.ResumeFin)})
				p.finSent = true
				p.nxt++
			}
		}
		ss.checkDone()
		finished := ss.finished
		ss.mu.Unlock()
		var err error
		if len(ctl) > 0 {
			_, err = p.s.Write(ctl)
		}
		for _, b := range out {
			if err != nil {
				break
			}
			_, err = p.s.Write(b)
		}
		if err == nil && finished {
			p.s.CloseWrite()
		}
		p.wmu.Unlock()
		if err != nil {
			ss.pathFailed(p, err)
			return
		}
		if finished {
			return
		}
	}
}

// sendable tells whether write has something for p. Under mu.
func (ss *session) sendable(p *path) bool {
	if !p.ready {
		return false
	}
	return ss.dlv != ss.ackSent && ss.ackDue() || p.nxt < ss.end || ss.eof && !p.finSent || ss.finished
}

// ackDue: an acknowledgement goes out on its own once a quarter of the
// window is unacknowledged, at the peer's FIN, or when the delayed-ack
// timer has fired. Under mu.
func (ss *session) ackDue() bool {
	return ss.dlv-ss.ackSent >= uint64(ss.d.cfg.ResumeWindow/4) || ss.peerFin || ss.ackTimer == nil
}

// read takes the peer's records from p.
func (ss *session) read(p *path, r *bufio.Reader) {
	err := ss.readLoop(p, r)
	if errors.Is(err, errResumeReset) {
		ss.fail(err, false)
		return
	}
	ss.mu.Lock()
	finished := ss.finished
	ss.mu.Unlock()
	if finished {
		// The peer closes its end after its last acknowledgement.
		p.s.Close()
		return
	}
	ss.pathFailed(p, err)
}

func (ss *session) readLoop(p *path, r *bufio.Reader) error {
	ss.mu.Lock()
	ready := p.ready
	ss.mu.Unlock()
	if !ready {
		// The opener's stream: the acceptor's HELLO first, within the
		// dial timeout (a far daemon that does not answer is as dead as
		// a broken stream).
		t := time.AfterFunc(ss.d.cfg.DialTimeout, func() { p.s.Abort() })
		_, rcv, acked, err := readHello(r)
		t.Stop()
		if err != nil {
			return err
		}
		ss.mu.Lock()
		if err := ss.checkHello(rcv, acked); err != nil {
			ss.mu.Unlock()
			return err
		}
		if ss.known {
			ss.d.resumes.Add(1)
		}
		ss.known = true
		ss.peerHello(p, rcv, acked)
		ss.mu.Unlock()
	}
	for {
		rec, err := header.ReadResumeRecord(r)
		if err != nil {
			return err
		}
		switch rec.Type {
		case header.ResumeData:
			if err := ss.received(p, rec.Data, uint64(len(rec.Data))); err != nil {
				return err
			}
		case header.ResumeFin:
			if err := ss.received(p, nil, 1); err != nil {
				return err
			}
		case header.ResumeAck:
			n := rec.Acked
			ss.mu.Lock()
			if n > p.nxt {
				ss.mu.Unlock()
				return fmt.Errorf("resume ACK of %d, beyond the %d sent", n, p.nxt)
			}
			ss.ack(n)
			ss.mu.Unlock()
		case header.ResumeReset:
			return errResumeReset
		}
	}
}

// received queues what p brought for the rank (b nil: the FIN), unless
// another stream took the connection over.
func (ss *session) received(p *path, b []byte, n uint64) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.p != p || p.dead {
		return errors.New("stream replaced")
	}
	ss.rcv += n
	if b != nil && len(ss.rq) == 0 && !ss.delivering {
		// Nothing before it: write what the rank's socket takes now,
		// without blocking, and queue the rest for toRank.
		ss.delivering = true
		ss.mu.Unlock()
		k, err := ss.rank.TryWrite(b)
		ss.mu.Lock()
		ss.delivering = false
		// A stream that took the connection over meanwhile may have
		// queued bytes behind these: toRank waits for this write.
		if len(ss.rq) > 0 {
			ss.deliverCond.Broadcast()
		}
		if err != nil {
			ss.mu.Unlock()
			ss.fail(fmt.Errorf("rank connection: %w", err), true)
			ss.mu.Lock()
			return err
		}
		if k > 0 {
			ss.dlv += uint64(k)
			ss.ackLater()
		}
		b = b[k:]
		if len(b) == 0 {
			return nil
		}
	}
	ss.rq = append(ss.rq, b)
	ss.deliverCond.Broadcast()
	return nil
}

// pathFailed handles the loss of p's stream: the opener opens another;
// the acceptor waits for it up to Config.Hold.
func (ss *session) pathFailed(p *path, err error) {
	ss.mu.Lock()
	if ss.p != p || p.dead || ss.err != nil {
		ss.mu.Unlock()
		p.s.Abort()
		return
	}
	p.dead = true
	ss.p = nil
	gen := ss.gen
	ss.wakeAll()
	ss.mu.Unlock()
	p.s.Abort()
	ss.d.cfg.Log.Info("resumable connection lost its stream; waiting for another", "gateway", p.s.Peer().String(), "err", err, "opener", ss.opener)
	if ss.opener && errors.Is(err, mx.ErrTimeout) {
		// The gateway itself stopped answering: the new stream tries
		// the others first, not after a share of the dial timeout.
		if i := slices.IndexFunc(ss.d.cfg.Gateways, func(g Gateway) bool { return g.MX == p.s.Peer() }); i >= 0 {
			ss.d.failed(i, err)
		}
	}
	if ss.opener {
		go ss.resume()
		return
	}
	time.AfterFunc(ss.d.cfg.Hold, func() {
		ss.mu.Lock()
		held := ss.p == nil && ss.err == nil && ss.gen == gen
		ss.mu.Unlock()
		if held {
			ss.fail(fmt.Errorf("no stream for %v after the last one broke (%v)", ss.d.cfg.Hold, err), false)
		}
	})
}

// resume opens a new stream for the connection (opener), within Hold.
func (ss *session) resume() {
	deadline := time.Now().Add(ss.d.cfg.Hold)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var lastErr error
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		ss.mu.Lock()
		over := ss.err != nil
		ss.mu.Unlock()
		if over {
			return
		}
		s, err := ss.redial(ctx)
		if err == nil {
			if ss.open(s) {
				ss.d.cfg.Log.Info("resumable connection carried on by a new stream", "gateway", s.Peer().String())
			}
			return
		}
		lastErr = err
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			ss.fail(fmt.Errorf("no gateway carried the connection again within %v: %v", ss.d.cfg.Hold, lastErr), false)
			return
		}
	}
}

// fail ends the connection: the rank's socket is reset and the other
// daemon told so (tell) when a stream is up.
func (ss *session) fail(err error, tell bool) {
	ss.mu.Lock()
	if ss.err != nil {
		ss.mu.Unlock()
		return
	}
	ss.err = err
	p := ss.p
	ss.wakeAll()
	close(ss.over)
	ss.mu.Unlock()
	if p != nil {
		if tell {
			refuseResume(p.s)
		} else {
			p.s.Abort()
		}
	}
	if ss.c != nil {
		reset(ss.c)
	}
	ss.d.cfg.Log.Info("resumable connection ended", "err", err)
}
