package mx

import (
	"context"
	"fmt"
	"time"

	"github.com/mpi5k/mpi5k/mx/wire"
)

// Endpoint is an MX endpoint: it holds channels to peers, posted receives
// and the messages that arrived before a receive matched them.
type Endpoint struct {
	e     *Engine
	id    uint16
	chans map[Addr]*channel
	ended map[Addr]error // why the last channel to a peer ended, until a new one opens
	// Posted receives. A receive from one peer that matches every bit but
	// the low eight (a stream's: its id and direction, any kind) waits in
	// exact, by peer and match bits, so a message finds it without a scan
	// of the others (an endpoint of a gateway holds one per stream, a
	// hundred thousand of them); the rest wait in posted. postSeq orders
	// them all: a message takes the first posted that matches it.
	posted     []*Request
	exact      map[Addr]map[uint64][]*Request
	nExact     int
	postSeq    uint64
	unexpected []*inMsg // messages in the order they arrived
	closed     bool
}

// exactMask is the mask of the receives kept in Endpoint.exact.
const exactMask = ^uint64(0xff)

// ID is the endpoint's id.
func (ep *Endpoint) ID() uint16 { return ep.id }

// Addr is the endpoint's address.
func (ep *Endpoint) Addr() Addr { return Addr{MAC: ep.e.mac, EP: ep.id} }

// inMsg is a message being received: matched to a receive (req) or waiting
// in the unexpected queue with the frames that carried it.
type inMsg struct {
	ch     *channel
	match  uint64
	msg    uint32
	length int
	got    int  // bytes arrived (eager) or pulled in (rendezvous)
	rts    bool // rendezvous: the bytes are pulled once matched
	req    *Request
	frames [][]byte // unexpected eager: pooled buffers
	parts  [][]byte // their payloads, in offset order
	pulled int      // rendezvous: bytes asked for so far
}

// Connect opens a channel to a peer endpoint, or returns at once if one is
// open. It fails with ErrTimeout if the peer does not answer within the
// peer timeout, ErrRejected if it has no such endpoint.
func (ep *Endpoint) Connect(ctx context.Context, to Addr) error {
	e := ep.e
	e.mu.Lock()
	if ep.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	ch := ep.chans[to]
	if ch == nil {
		ch = ep.newChannel(to)
		ch.state = stateConnecting
		ch.connWait = make(chan struct{})
		ch.connectStart = e.now()
		ch.sendConnect(wire.TypeConnect)
	}
	wait := ch.connWait
	e.mu.Unlock()
	if wait == nil {
		return nil
	}
	select {
	case <-wait:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return ch.err
}

// Connected reports whether a channel to the peer is open.
func (ep *Endpoint) Connected(to Addr) bool {
	ep.e.mu.Lock()
	defer ep.e.mu.Unlock()
	ch := ep.chans[to]
	return ch != nil && ch.state == stateOpen
}

func (ep *Endpoint) onConnect(from Addr, h *wire.Header, p []byte) {
	c, err := wire.ParseConnect(p)
	if err != nil {
		ep.e.c.malformed.Add(1)
		return
	}
	ch := ep.chans[from]
	if ch != nil && ch.peerSession == h.Session && ch.state == stateOpen {
		ch.sendConnect(wire.TypeConnectAck) // our answer was lost
		return
	}
	if ch != nil && ch.state == stateOpen {
		ch.fail(fmt.Errorf("%w: %v reconnected (it restarted)", ErrPeerClosed, from))
		ch = nil
	}
	if ch == nil {
		ch = ep.newChannel(from)
	}
	// A CONNECT that crosses ours: both ends then hold the channel open
	// with each other's session.
	ch.open(h.Session, int(c.MaxFrame), h.Window)
	ch.sendConnect(wire.TypeConnectAck)
}

func (ep *Endpoint) onConnectAck(from Addr, h *wire.Header, p []byte) {
	c, err := wire.ParseConnect(p)
	if err != nil {
		ep.e.c.malformed.Add(1)
		return
	}
	ch := ep.chans[from]
	if ch == nil || h.Ack != ch.session {
		ep.e.c.stale.Add(1)
		return
	}
	if ch.state == stateOpen {
		return
	}
	ch.open(h.Session, int(c.MaxFrame), h.Window)
}

// notOpen is the error for a request to a peer with no open channel: why
// the last one ended, so that a send after a failure names the failure
// rather than a missing Connect. (A failed channel leaves ep.chans at
// once: one found there is connecting or open, never failed.)
func (ep *Endpoint) notOpen(to Addr) error {
	if err := ep.ended[to]; err != nil {
		return fmt.Errorf("%w (Connect again)", err)
	}
	return fmt.Errorf("%w: %v", ErrNotConnected, to)
}

// Isend sends buf to a connected peer with match bits. buf must stay
// unchanged until the request completes: at once for an eager message
// once its frames are built, after the receiver pulled it for a large one.
func (ep *Endpoint) Isend(to Addr, match uint64, buf []byte) (*Request, error) {
	if uint64(len(buf)) > 1<<32-1 {
		return nil, fmt.Errorf("mx: message of %d bytes, at most 4 GiB-1", len(buf))
	}
	e := ep.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if ep.closed {
		return nil, ErrClosed
	}
	ch := ep.chans[to]
	if ch == nil || ch.state != stateOpen {
		return nil, ep.notOpen(to)
	}
	r := &Request{done: make(chan struct{}), ep: ep, buf: buf, n: len(buf)}
	msg := ch.msgNext
	ch.msgNext++
	if len(buf) <= e.cfg.EagerMax {
		ch.queue = append(ch.queue, &sendItem{kind: wire.TypeEager, msg: msg, match: match, data: buf, req: r})
	} else {
		ch.rndv[msg] = r
		ch.queue = append(ch.queue, &sendItem{kind: wire.TypeRTS, msg: msg, match: match, data: buf})
	}
	ch.pump()
	return r, nil
}

// Send is Isend and Wait.
func (ep *Endpoint) Send(ctx context.Context, to Addr, match uint64, buf []byte) error {
	r, err := ep.Isend(to, match, buf)
	if err != nil {
		return err
	}
	_, err = r.Wait(ctx)
	return err
}

// Irecv posts a receive into buf for the first message, from any peer,
// whose match bits equal match on the bits set in mask.
func (ep *Endpoint) Irecv(buf []byte, match, mask uint64) *Request {
	return ep.irecv(buf, match, mask, nil)
}

// IrecvFrom is Irecv for messages from one peer only; it fails if the
// channel to that peer fails.
func (ep *Endpoint) IrecvFrom(from Addr, buf []byte, match, mask uint64) *Request {
	return ep.irecv(buf, match, mask, &from)
}

// Recv is Irecv and Wait.
func (ep *Endpoint) Recv(ctx context.Context, buf []byte, match, mask uint64) (int, uint64, Addr, error) {
	r := ep.Irecv(buf, match, mask)
	if _, err := r.Wait(ctx); err != nil && ep.Cancel(r) {
		return 0, 0, Addr{}, err
	}
	return r.Status()
}

func (r *Request) matches(from Addr, match uint64) bool {
	return (match^r.want)&r.mask == 0 && (r.filter == nil || *r.filter == from)
}

func (ep *Endpoint) irecv(buf []byte, match, mask uint64, from *Addr) *Request {
	r := &Request{done: make(chan struct{}), ep: ep, buf: buf, want: match, mask: mask, filter: from, recv: true}
	ep.post(r)
	return r
}

// irecvLazy posts a receive from one peer whose buffer, size bytes from
// the streams' pool, is taken only when a message matches it: an idle
// stream's receive holds none. notify runs once the request is done
// (Request.notify).
func (ep *Endpoint) irecvLazy(from Addr, size int, match, mask uint64, notify func()) *Request {
	r := &Request{done: make(chan struct{}), ep: ep, lazy: size, want: match, mask: mask, filter: &from, recv: true, notify: notify}
	ep.post(r)
	return r
}

func (ep *Endpoint) post(r *Request) {
	e := ep.e
	from := r.filter
	e.mu.Lock()
	defer e.mu.Unlock()
	if ep.closed {
		r.finish(ErrClosed)
		return
	}
	if from != nil {
		if ch := ep.chans[*from]; ch == nil || ch.state != stateOpen {
			r.finish(ep.notOpen(*from))
			return
		}
	}
	for i, m := range ep.unexpected {
		if r.matches(m.ch.peer, m.match) {
			ep.unexpected = append(ep.unexpected[:i], ep.unexpected[i+1:]...)
			m.bind(r)
			return
		}
	}
	ep.postSeq++
	r.seq = ep.postSeq
	if r.filter == nil || r.mask != exactMask {
		ep.posted = append(ep.posted, r)
		return
	}
	if ep.exact == nil {
		ep.exact = map[Addr]map[uint64][]*Request{}
	}
	byMatch := ep.exact[*r.filter]
	if byMatch == nil {
		byMatch = map[uint64][]*Request{}
		ep.exact[*r.filter] = byMatch
	}
	byMatch[r.want&exactMask] = append(byMatch[r.want&exactMask], r)
	ep.nExact++
}

// Cancel withdraws a posted receive that no message matched yet; it
// reports whether it did (the request then ends with ErrCanceled).
func (ep *Endpoint) Cancel(r *Request) bool {
	ep.e.mu.Lock()
	defer ep.e.mu.Unlock()
	if !ep.unpost(r) {
		return false
	}
	r.finish(ErrCanceled)
	return true
}

// unpost removes r from the posted receives, if it waits there.
func (ep *Endpoint) unpost(r *Request) bool {
	if r.filter != nil && r.mask == exactMask {
		byMatch := ep.exact[*r.filter]
		l := byMatch[r.want&exactMask]
		for i, p := range l {
			if p == r {
				ep.dropExact(*r.filter, byMatch, r.want&exactMask, append(l[:i:i], l[i+1:]...))
				return true
			}
		}
		return false
	}
	for i, p := range ep.posted {
		if p == r {
			ep.posted = append(ep.posted[:i], ep.posted[i+1:]...)
			return true
		}
	}
	return false
}

// dropExact stores what is left of a list of exact receives.
func (ep *Endpoint) dropExact(from Addr, byMatch map[uint64][]*Request, key uint64, rest []*Request) {
	ep.nExact--
	if len(rest) > 0 {
		byMatch[key] = rest
		return
	}
	delete(byMatch, key)
	// The peer's map stays (a stream posts again at once) until its
	// channel fails or the endpoint closes.
}

// first finds the first posted receive for a message, and where it waits
// (i: its index in posted, or -1 in exact).
func (ep *Endpoint) first(from Addr, match uint64) (r *Request, i int) {
	for j, p := range ep.posted {
		if p.matches(from, match) {
			r, i = p, j
			break
		}
	}
	if l := ep.exact[from][match&exactMask]; len(l) > 0 && (r == nil || l[0].seq < r.seq) {
		return l[0], -1
	}
	return r, i
}

// match finds and removes the first posted receive for a new message.
func (ep *Endpoint) match(from Addr, match uint64) *Request {
	r, i := ep.first(from, match)
	switch {
	case r == nil:
	case i >= 0:
		ep.posted = append(ep.posted[:i], ep.posted[i+1:]...)
	default:
		byMatch := ep.exact[from]
		ep.dropExact(from, byMatch, match&exactMask, byMatch[match&exactMask][1:])
	}
	return r
}

// failPosted ends the receives posted for peer's messages only, whose
// channel failed with err.
func (ep *Endpoint) failPosted(peer Addr, err error) {
	posted := ep.posted[:0]
	for _, r := range ep.posted {
		if r.filter != nil && *r.filter == peer {
			r.finish(err)
			continue
		}
		posted = append(posted, r)
	}
	clear(ep.posted[len(posted):])
	ep.posted = posted
	for _, l := range ep.exact[peer] {
		for _, r := range l {
			r.finish(err)
			ep.nExact--
		}
	}
	delete(ep.exact, peer)
}

// postedCount is how many receives wait.
func (ep *Endpoint) postedCount() int { return len(ep.posted) + ep.nExact }

// bind attaches receive r to message m: the bytes that arrived are copied,
// a rendezvous starts pulling.
func (m *inMsg) bind(r *Request) {
	if r.lazy > 0 && r.buf == nil {
		r.buf = getChunk(r.lazy)
	}
	m.req = r
	r.in = m
	r.match = m.match
	r.from = m.ch.peer
	r.n = min(m.length, len(r.buf))
	if m.rts {
		m.ch.pulls[m.msg] = m
		m.pullMore()
		return
	}
	off := 0
	for _, p := range m.parts {
		if off < len(r.buf) {
			copy(r.buf[off:], p)
		}
		off += len(p)
	}
	for _, f := range m.frames {
		m.ch.ep.e.rx.put(f)
	}
	m.frames, m.parts = nil, nil
	m.ch.windowUpdate()
	if m.got == m.length {
		m.complete()
	} else {
		m.ch.rxMsgs[m.msg] = m
	}
}

func (m *inMsg) complete() {
	delete(m.ch.rxMsgs, m.msg)
	var err error
	if m.length > len(m.req.buf) {
		err = fmt.Errorf("%w: %d bytes from %v into %d", ErrTruncated, m.length, m.ch.peer, len(m.req.buf))
	}
	m.req.finish(err)
}

// want is how many bytes of a rendezvous message the receive takes.
func (m *inMsg) want() int { return min(m.length, len(m.req.buf)) }

// pullMore keeps PullAhead blocks of a rendezvous message asked for.
func (m *inMsg) pullMore() {
	cfg := &m.ch.ep.e.cfg
	for m.pulled < m.want() && m.pulled-m.got < cfg.PullAhead*cfg.PullBlock {
		n := min(cfg.PullBlock, m.want()-m.pulled)
		m.ch.ctl = append(m.ch.ctl, &sendItem{kind: wire.TypePull, msg: m.msg, off: m.pulled, end: m.pulled + n})
		m.pulled += n
	}
	if m.want() == 0 { // a zero-length receive buffer: nothing to pull
		m.rndvDone()
	}
	m.ch.pump()
}

func (m *inMsg) rndvDone() {
	delete(m.ch.pulls, m.msg)
	m.ch.ctl = append(m.ch.ctl, &sendItem{kind: wire.TypeDone, msg: m.msg})
	m.ch.pump()
	var err error
	if m.length > len(m.req.buf) {
		err = fmt.Errorf("%w: %d bytes from %v into %d", ErrTruncated, m.length, m.ch.peer, len(m.req.buf))
	}
	m.req.finish(err)
}

// Close closes the endpoint: every channel is told (DISCONNECT, after the
// frames before it) and every pending request fails with ErrClosed.
func (ep *Endpoint) Close() error {
	ep.e.mu.Lock()
	defer ep.e.mu.Unlock()
	ep.closeLocked(true)
	return nil
}

func (ep *Endpoint) closeLocked(tell bool) {
	if ep.closed {
		return
	}
	ep.closed = true
	for _, ch := range ep.chans {
		if tell && ch.state == stateOpen {
			// Best effort: the frame goes out now if the window allows;
			// the channel's state is dropped either way.
			ch.queue = append(ch.queue, &sendItem{kind: wire.TypeDisconnect})
			ch.pump()
		}
		ch.fail(fmt.Errorf("%w: endpoint %d closed", ErrClosed, ep.id))
	}
	for _, r := range ep.posted {
		r.finish(fmt.Errorf("%w: endpoint %d closed", ErrClosed, ep.id))
	}
	ep.posted = nil
	for _, byMatch := range ep.exact {
		for _, l := range byMatch {
			for _, r := range l {
				r.finish(fmt.Errorf("%w: endpoint %d closed", ErrClosed, ep.id))
			}
		}
	}
	ep.exact, ep.nExact = nil, 0
	for _, m := range ep.unexpected {
		for _, f := range m.frames {
			ep.e.rx.put(f)
		}
	}
	ep.unexpected = nil
	delete(ep.e.eps, ep.id)
}

// timeNever is a zero deadline: nothing due.
var timeNever time.Time
