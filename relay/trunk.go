package relay

// A site pair's links and the streams they share. A DATA frame's link is
// chosen by pick (called by forward, outbound.go):
//
//  1. the stream's home link, until the peer has confirmed the stream;
//  2. the express link, for a burst of at most ExpressMax bytes within
//     the stream's budget (expressBudget), unless a hold keeps messages
//     off it (HoldExpress);
//  3. else the bulk link with the fewest bytes queued (striping), or the
//     home link with NoStripe.
//
// A stream enters the trunk's table at its OPEN (register) and leaves it
// at its end (remove); a failed link takes with it the streams it breaks
// (down).

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// Trunk is the set of links between two site gateways (docs/wire-format.md,
// HELLO feature TRUNK). Its links share one stream table and one stream id
// space, so a stream's DATA may travel on any of them: messages take the
// express link, everything else is striped over the bulk links, and the
// receiver puts them back in order by their offsets (DATA_AT). A stream's
// control frames stay on its home link, the one its OPEN used.
//
// A lone link made by NewLink is a trunk of one in the old mode: plain DATA,
// in order, no offsets.
type Trunk struct {
	dialer  bool
	handler Handler
	lanes   bool // DATA_AT and HALF_CLOSE offsets; DATA may use any link

	mu      sync.Mutex
	streams map[uint32]*Stream
	nextID  uint32
	links   []*Link // by index; nil while down
	express int     // index of the express link, -1 without one
	rr      int     // rotates the first candidate of the least-loaded choice
	queueOn bool    // controlQueue runs
	onRenew func()  // the dialer's: renew the express link
	// xCtl is the express controller, made by the first StepExpress
	// (Config.ExpressControl).
	xCtl ExpressController
	// xHold: until when (unix ns) messages stay off the express link
	// (HoldExpress).
	xHold atomic.Int64
	// early is the DATA bytes buffered for streams not yet connected to
	// their destination (Config.MaxEarly).
	early atomic.Int64
}

// takeEarly counts n more early bytes unless that passes max.
func (t *Trunk) takeEarly(n, max int64) bool {
	if t.early.Add(n) > max {
		t.early.Add(-n)
		return false
	}
	return true
}

// EarlyBytes is the DATA buffered for streams whose destination is not
// connected yet.
func (t *Trunk) EarlyBytes() int64 { return t.early.Load() }

// OnRenew sets what the dialing side does when the express link should be
// renewed (the peer asked with RENEW, or it retired a link we still use):
// normally connect a new express link and Add it.
func (t *Trunk) OnRenew(f func()) {
	t.mu.Lock()
	t.onRenew = f
	t.mu.Unlock()
}

func (t *Trunk) askRenew() {
	t.mu.Lock()
	f := t.onRenew
	t.mu.Unlock()
	if f != nil {
		f()
	}
}

// NewTrunk returns an empty trunk. dialer tells which side allocates odd
// stream ids; handler receives the streams the peer opens (nil refuses them).
func NewTrunk(dialer bool, handler Handler) *Trunk {
	t := &Trunk{dialer: dialer, handler: handler, lanes: true, streams: map[uint32]*Stream{}, nextID: 2, express: -1}
	if dialer {
		t.nextID = 1
	}
	return t
}

// NewLink starts multiplexing on conn after a successful Handshake, as a
// link of its own (plain DATA in order, no trunk). cfg's zero fields take
// their defaults; a cfg that Validate rejects panics (see Config).
func NewLink(conn net.Conn, cfg Config, peer header.Hello, dialer bool, handler Handler) *Link {
	t := NewTrunk(dialer, handler)
	t.lanes = false
	return t.Add(conn, cfg, peer, 0, false)
}

// AddResumable is Add for a link both of whose HELLOs carried a session
// and feature RESUME: local is the session this side gave it. The link
// then survives a broken connection (Resume).
func (t *Trunk) AddResumable(conn net.Conn, cfg Config, peer header.Hello, index int, express bool, local uint64) *Link {
	return t.add(conn, cfg, peer, index, express, local)
}

// Add starts multiplexing on conn as link index of the trunk after a
// successful Handshake, replacing a failed link of that index. The express
// link carries the messages of every stream and never homes one. An express
// link that is still up when its successor is added (a renewal, with
// HELLO feature RENEW) retires: it finishes what it has queued, ends with
// RETIRE and closes without resetting any stream. cfg is taken as by
// NewLink.
func (t *Trunk) Add(conn net.Conn, cfg Config, peer header.Hello, index int, express bool) *Link {
	return t.add(conn, cfg, peer, index, express, 0)
}

func (t *Trunk) add(conn net.Conn, cfg Config, peer header.Hello, index int, express bool, session uint64) *Link {
	l := newLink(conn, cfg, peer, t, index, express, session)
	t.mu.Lock()
	for len(t.links) <= index {
		t.links = append(t.links, nil)
	}
	old := t.links[index]
	t.links[index] = l
	if express {
		t.express = index
	}
	t.mu.Unlock()
	l.start()
	if old != nil && !old.Down() && old.renewable() && l.renewable() && old.retire(l) {
		l.renews.Store(true)
	}
	return l
}

// HoldExpress sends this side's messages on the bulk links for d from now,
// as if the trunk had no express link; d <= 0 ends a hold. The express
// link stays up (and is renewed as before), so the peer may go on using
// it. The express controller (StepExpress) holds it while another flow
// keeps the WAN queue full: the messages wait in that queue on any link,
// and there the express link's loss-based window is cut again and again
// while a primed bulk link's holds.
func (t *Trunk) HoldExpress(d time.Duration) { t.xHold.Store(time.Now().Add(d).UnixNano()) }

// ExpressHeld reports whether a hold (HoldExpress) keeps messages off the
// express link at now.
func (t *Trunk) ExpressHeld(now time.Time) bool { return now.UnixNano() < t.xHold.Load() }

// expressSent returns the DATA bytes the trunk's express link has sent,
// and false when it has no working express link (messages then share the
// bulk links).
func (t *Trunk) expressSent() (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.express < 0 || t.links[t.express] == nil || t.links[t.express].dead.Load() {
		return 0, false
	}
	return t.links[t.express].Stats.BytesSent.Load(), true
}

// NumStreams is the number of live streams over all links.
func (t *Trunk) NumStreams() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.streams)
}

func (t *Trunk) lookup(id uint32) *Stream {
	t.mu.Lock()
	s := t.streams[id]
	t.mu.Unlock()
	return s
}

// register allocates an id (id 0) or takes the peer's, and records s. It
// fails when the id is live or its link is down.
func (t *Trunk) register(s *Stream, id uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.l.dead.Load() {
		return false
	}
	if id == 0 {
		id = t.nextID
		t.nextID += 2
	} else if _, dup := t.streams[id]; dup {
		return false
	}
	s.id = id
	t.streams[id] = s
	s.l.homed.Add(1)
	return true
}

func (t *Trunk) remove(s *Stream) {
	t.mu.Lock()
	if t.streams[s.id] == s {
		delete(t.streams, s.id)
		s.l.homed.Add(-1)
	}
	t.mu.Unlock()
}

// all returns every live stream.
func (t *Trunk) all() []*Stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	ss := make([]*Stream, 0, len(t.streams))
	for _, s := range t.streams {
		ss = append(ss, s)
	}
	return ss
}

// broken returns the streams marked ResetOnBreak that the broken link l
// homes or that used it.
func (t *Trunk) broken(l *Link) []*Stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ss []*Stream
	bit := uint64(1) << l.index
	for _, s := range t.streams {
		if s.resetOnBreak.Load() && (s.l == l || s.used.Load()&bit != 0) {
			ss = append(ss, s)
		}
	}
	return ss
}

// down takes the failed link l out and returns the streams it breaks: those
// it homes, and (in a trunk) those that have sent or received DATA on it,
// since bytes of theirs may be lost with it.
func (t *Trunk) down(l *Link) (home, crossing []*Stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.index < len(t.links) && t.links[l.index] == l {
		t.links[l.index] = nil
	}
	bit := uint64(1) << l.index
	for _, s := range t.streams {
		switch {
		case s.l == l:
			home = append(home, s)
		case s.used.Load()&bit != 0:
			crossing = append(crossing, s)
		}
	}
	return home, crossing
}

// Which DATA takes the express link. A message is a burst of bytes the
// application writes without pausing; a burst of at most ExpressMax bytes
// is small, and each stream may put ExpressMax bytes per round trip on the
// express link (Stream.expressBudget). The bytes of a longer burst go to the
// bulk links even when the reads return them in small pieces, as loopback's
// 64 KiB segments or a LAN no faster than the WAN do.
const (
	// burstGap: a read that waited this long starts a new burst. Far
	// shorter than the WAN round trip a message exchange across sites waits
	// for, far longer than the gaps between the reads of a stream that has
	// more queued.
	burstGap = 500 * time.Microsecond
	// ExpressFloor is the shortest round trip the express budget assumes,
	// so a stream sends at most ExpressMax/ExpressFloor express bytes per
	// second (105 Mbit/s at 64 KiB) whatever the link's RTT.
	ExpressFloor = 5 * time.Millisecond
)

// pick chooses the link for the next k DATA bytes of s, read at now, which
// end a burst of s.burst bytes. Before the peer has confirmed the stream
// (OPEN_OK) everything stays on the home link, so no DATA can reach the peer
// ahead of the OPEN that creates the stream there. Called from s's out-stage
// only.
func (t *Trunk) pick(s *Stream, k int, now time.Time) *Link {
	if !t.lanes || !s.confirmed.Load() {
		return s.l
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.burst <= s.l.cfg.ExpressMax && t.express >= 0 && !t.ExpressHeld(now) {
		if x := t.links[t.express]; x != nil && !x.dead.Load() && !x.down.Load() && s.expressBudget(k, time.Duration(x.Stats.RTT.Load()), now) {
			return x
		}
	}
	if s.l.cfg.NoStripe && !s.l.dead.Load() && !s.l.down.Load() {
		return s.l
	}
	// Least bytes waiting in user space; the rotation spreads equal ones, so
	// a stream's consecutive chunks go out on different links (striping).
	// A link that is down (waiting to resume) only when all are.
	var best *Link
	var bestQ int64
	bestDown := true
	t.rr++
	for i := range t.links {
		l := t.links[(t.rr+i)%len(t.links)]
		if l == nil || l.express || l.dead.Load() {
			continue
		}
		down := l.down.Load()
		if q := l.queued.Load(); best == nil || bestDown && !down || down == bestDown && q < bestQ {
			best, bestQ, bestDown = l, q, down
		}
	}
	if best == nil {
		return s.l
	}
	return best
}

// expressBudget takes n bytes from the stream's express budget: ExpressMax
// bytes per round trip rtt of the express link (at least ExpressFloor), so
// one message per round trip, a request or a reply, always fits, and a
// stream that sends more is throughput-bound: the bulk links are for it.
func (s *Stream) expressBudget(n int, rtt time.Duration, now time.Time) bool {
	full := int64(s.l.cfg.ExpressMax)
	per := max(rtt, ExpressFloor)
	if d := now.Sub(s.xAt); d >= per {
		s.xTokens = full
	} else {
		s.xTokens = min(full, s.xTokens+full*int64(d)/int64(per))
	}
	s.xAt = now
	if int64(n) > s.xTokens {
		return false
	}
	s.xTokens -= int64(n)
	return true
}
