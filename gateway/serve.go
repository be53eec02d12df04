package gateway

// The LAN side. A node's connection passes
//
//  1. serveLAN: accepted (acceptEach) from a node of this site and given
//     a place in the limits (pendingTable.admit), or reset;
//  2. handleLAN: its first frame, within FirstFrame: OPEN, or PEER_QUERY
//     or LISTEN (a control connection: serveControl, listeners.go);
//  3. openFromLAN: the destination policy, a WAN link to the
//     destination's site (pickLink, peers.go), and the stream on it
//     (relay.Link.Open), which from then on carries its bytes.
//
// A stream a peer opens passes
//
//  1. openFromWAN, the trunks' relay.Handler, on the link's reader: the
//     destination and source policy, the peer's stream limit;
//  2. LANTransport.Dial (lan.go): the destination connected, its true
//     source recorded for PEER_QUERY (records) before it can ask;
//  3. relay.Stream.Accept: OPEN_OK goes out, and bytes flow both ways.

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
)

func (g *Gateway) serveLAN() {
	defer g.wg.Done()
	acceptEach(g, "lan", g.lanLn.Accept, func(c LANConn) {
		// Only the site's nodes take a place in the limits, or make room
		// in them (admit).
		if s, ok := g.curMap().Lookup(c.Remote().Addr()); !ok || s.ID != g.site.ID {
			g.refuseLAN(c, "lan_source", "source is not a node of this site")
			return
		}
		e, victim, reason := g.pending.admit(g, c)
		if victim != nil {
			g.refused("lan_pending_evicted", "LAN connection dropped before its first frame: its host holds the most of the full MaxPendingLAN/MaxLANConns, and another host needs room",
				"remote", victim.Remote().String())
			g.m.lanRefused.Inc()
			victim.Abort()
		}
		switch reason {
		case "":
			go g.handleLAN(c, e, func() { g.lanConns.Add(-1) })
		case "lan_conns":
			g.refuseLAN(c, reason, "too many LAN connections", "limit", g.cfg.MaxLANConns)
		case "lan_pending":
			g.refuseLAN(c, reason, "too many LAN connections waiting for their first frame", "limit", g.cfg.MaxPendingLAN)
		case "source_pending":
			g.refuseLAN(c, reason, "the source host has too many LAN connections waiting for their first frame", "limit", g.cfg.MaxSourcePending)
		}
	})
}

// pendingTable holds the LAN connections that have not sent their first
// frame yet, by source host, oldest first. When MaxPendingLAN or
// MaxLANConns is full, a new connection takes the place of the oldest
// pending connection of the host that holds the most, if that is another
// host holding more than the newcomer's: one host's silent connections
// (any number of them) cannot keep another host's rank from opening a
// stream, while one host alone may still use the whole of both limits
// for a burst of connects (a job's wire-up from a node of many ranks
// can have hundreds pending at once).
type pendingTable struct {
	mu sync.Mutex
	by map[netip.Addr]*list.List // of *pendingConn
	n  int
}

// pendingConn is a connection in the pendingTable.
type pendingConn struct {
	c       LANConn
	el      *list.Element
	evicted bool // taken out to make room (admit); under the table's mu
}

// admit counts c in MaxLANConns and MaxPendingLAN, making room if it
// must (the victim, for the caller to abort), or returns the reason of
// its refusal.
func (t *pendingTable) admit(g *Gateway, c LANConn) (e *pendingConn, victim LANConn, reason string) {
	a := c.Remote().Addr()
	t.mu.Lock()
	defer t.mu.Unlock()
	mine := t.by[a]
	have := 0
	if mine != nil {
		have = mine.Len()
	}
	fullConns := g.lanConns.Load() >= int64(g.cfg.MaxLANConns)
	var big *list.List
	if fullConns || t.n >= g.cfg.MaxPendingLAN {
		for _, l := range t.by {
			if big == nil || l.Len() > big.Len() {
				big = l
			}
		}
		if big == nil || big == mine || big.Len() <= have {
			if fullConns {
				return nil, nil, "lan_conns"
			}
			return nil, nil, "lan_pending"
		}
	}
	if have >= g.cfg.MaxSourcePending {
		return nil, nil, "source_pending"
	}
	if big != nil {
		v := big.Remove(big.Front()).(*pendingConn)
		v.evicted = true
		t.drop(v.c.Remote().Addr(), big)
		victim = v.c
		// Its MaxLANConns place is the newcomer's: the victim gives it
		// back when its handler ends, so the count may pass the limit
		// by the victims not yet gone.
	}
	if t.by == nil {
		t.by = map[netip.Addr]*list.List{}
	}
	if mine == nil {
		mine = list.New()
		t.by[a] = mine
	}
	e = &pendingConn{c: c}
	e.el = mine.PushBack(e)
	t.n++
	g.lanConns.Add(1)
	g.lanPending.Store(int64(t.n))
	return e, victim, ""
}

// drop counts one connection of a's list l out (caller holds mu).
func (t *pendingTable) drop(a netip.Addr, l *list.List) {
	t.n--
	if l.Len() == 0 {
		delete(t.by, a)
	}
}

// done takes e out once its first frame has come (or never will); it
// reports whether admit had already taken it out to make room.
func (t *pendingTable) done(g *Gateway, e *pendingConn) (evicted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !e.evicted {
		a := e.c.Remote().Addr()
		l := t.by[a]
		l.Remove(e.el)
		t.drop(a, l)
	}
	g.lanPending.Store(int64(t.n))
	return e.evicted
}

// acceptEach hands every connection the listener accepts to admit, until
// the listener closes. A failed accept (EMFILE, say) is retried after 10
// ms and logged at most once per interval, since it would repeat at that
// rate.
func acceptEach[C any](g *Gateway, side string, accept func() (C, error), admit func(C)) {
	for {
		c, err := accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			g.refusals.Log(g.log, slog.LevelWarn, side+"_accept", strings.ToUpper(side)+" accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		admit(c)
	}
}

// refused logs a refusal (at most one line per reason per interval) and
// counts it in mpi5k_refusals_total.
func (g *Gateway) refused(reason, msg string, args ...any) {
	g.m.refusals.WithLabelValues(reason).Inc()
	g.refusals.Log(g.log, slog.LevelWarn, reason, msg, args...)
}

// refuseLAN resets a LAN connection, refused for reason (a metric label;
// msg says it to the operator).
func (g *Gateway) refuseLAN(c LANConn, reason, msg string, args ...any) {
	g.refused(reason, "LAN connection refused: "+msg, append([]any{"remote", c.Remote().String()}, args...)...)
	g.m.lanRefused.Inc()
	c.Abort()
}

// handleLAN reads the first frame of a node's connection: OPEN (then raw
// bytes both ways), or PEER_QUERY or LISTEN (a control connection). It
// calls ended once the connection has ended: the connection counts in
// MaxLANConns until then, a stream in its source's MaxSourceStreams and
// a control connection in its MaxSourceControl. Until its first frame it
// counts in MaxPendingLAN and its source's MaxSourcePending. A stream's
// end is waited for without a goroutine (AfterDone).
func (g *Gateway) handleLAN(c LANConn, e *pendingConn, ended func()) {
	streaming := false
	defer func() {
		if !streaming {
			ended()
		}
	}()
	remote := c.Remote()
	pending, evicted := true, false
	unpend := func() {
		if pending {
			pending = false
			evicted = g.pending.done(g, e)
		}
	}
	defer unpend()
	m := g.curMap()
	if gs, ok := m.GatewaySite(remote.Addr()); ok && (gs.ID != g.site.ID || g.records.isLocal(remote)) {
		// A gateway never has a reason to open a stream: this is a
		// connection the gateway dialed to a destination that led back
		// here (a loop), or another site's gateway.
		g.refuseLAN(c, "lan_from_gateway", "source is a gateway's own socket (a relay loop)", "gateway_site", gs.Name)
		return
	}
	// The first frame's deadline ends once it is read: a control
	// connection lives on in this call, for as long as the rank's process.
	dl, _ := c.(interface{ SetReadDeadline(time.Time) error })
	var abort *time.Timer
	if dl != nil {
		dl.SetReadDeadline(time.Now().Add(g.cfg.FirstFrame))
	} else {
		// A transport without deadlines (MX): the connection is aborted
		// instead, which ends the read.
		abort = time.AfterFunc(g.cfg.FirstFrame, func() { c.Abort() })
	}
	// Read the first frame exactly (no read-ahead): after OPEN come the
	// application's own bytes, which belong to the stream. Its type and
	// length are checked before its body is read, so whatever a
	// connection declares it costs at most a control frame.
	h, body, err := header.ReadFirst(c, header.TypeOpen, header.TypePeerQuery, header.TypeListen)
	if abort != nil {
		abort.Stop() // a frame read as it fired is followed by the abort's error
	}
	if err != nil {
		if unpend(); evicted {
			return // logged and aborted by the newcomer
		}
		// err says which: none (EOF, timeout), undecodable, or truncated.
		g.refuseLAN(c, "lan_first_frame", "no valid first frame", "err", err)
		return
	}
	if dl != nil {
		dl.SetReadDeadline(time.Time{})
	}
	if unpend(); evicted {
		return // made room for another host's connection: aborted
	}
	switch h.Type {
	case header.TypeOpen:
		if s := g.openFromLAN(c, h, body); s != nil {
			streaming = true
			s.AfterDone(func() {
				g.sources.release(remote.Addr())
				ended()
			})
		}
	case header.TypePeerQuery, header.TypeListen:
		if !g.controlBy.acquire(remote.Addr(), g.cfg.MaxSourceControl) {
			g.refuseLAN(c, "source_control", "the source host has too many control connections open", "limit", g.cfg.MaxSourceControl)
			return
		}
		g.lanControl.Add(1)
		g.serveControl(c, h, body)
		g.lanControl.Add(-1)
		g.controlBy.release(remote.Addr())
	default:
		g.refuseLAN(c, "lan_first_frame", "first frame must be OPEN, PEER_QUERY or LISTEN", "type", h.Type.String())
	}
}

// openFromLAN opens the stream a node asks for, or refuses it (nil). The
// caller releases the stream's place in its source's MaxSourceStreams
// once it has ended.
func (g *Gateway) openFromLAN(c LANConn, h header.Header, body []byte) *relay.Stream {
	if h.Stream != 0 {
		g.refuseLAN(c, "lan_open", "LAN OPEN must use stream 0", "stream", h.Stream)
		return nil
	}
	o, err := header.ParseOpen(body)
	if err != nil {
		g.refuseLAN(c, "lan_open", "bad OPEN", "err", err)
		return nil
	}
	o.Dst = unmapAP(o.Dst)
	o.Src = unmapAP(o.Src)
	// The whole endpoint, port too: the far side's PEER_QUERY answers
	// with it, so a node must not name a port it does not own.
	if o.Src != c.Remote() {
		g.refuseLAN(c, "lan_open", "OPEN source differs from the connection's source", "src", o.Src.String())
		return nil
	}
	m := g.curMap()
	dsite, ok := m.Lookup(o.Dst.Addr())
	if !ok || dsite.ID == g.site.ID {
		g.refuseLAN(c, "lan_open", "destination is not in another site of the map", "dst", o.Dst.String())
		return nil
	}
	if gs, ok := m.GatewaySite(o.Dst.Addr()); ok {
		g.refuseLAN(c, "dst_gateway", "destination is a gateway: gateways are never relayed to (a loop)", "dst", o.Dst.String(), "gateway_site", gs.Name)
		return nil
	}
	if !g.sources.acquire(o.Src.Addr(), g.cfg.MaxSourceStreams) {
		g.refuseLAN(c, "source_streams", "the source host has too many streams open", "limit", g.cfg.MaxSourceStreams)
		return nil
	}
	// A reload between the map's lookup and this one leaves no peer.
	ps := g.peersOf(dsite.ID)
	if len(ps) == 0 {
		g.sources.release(o.Src.Addr())
		g.refuseLAN(c, "no_link", "destination's site left the site map (reloaded)", "dst", o.Dst.String(), "peer", dsite.Name)
		return nil
	}
	l := g.pickLink(ps)
	if l == nil {
		g.sources.release(o.Src.Addr())
		g.refuseLAN(c, "no_link", "no WAN link to the destination's site", "dst", o.Dst.String(), "peer", dsite.Name)
		return nil
	}
	if !o.Resume.IsZero() {
		// The node daemon waits for this answer before it frames its
		// bytes; a far gateway that reaches ranks directly gets a plain
		// OPEN.
		ok := l.Peer().Features&header.FeatureNodeResume != 0
		if !ok {
			o.Resume = header.ResumeID{}
		}
		if _, err := c.Write(header.AppendFrame(nil, header.TypeOpenReply, 0, resumeVerdict(ok))); err != nil {
			g.sources.release(o.Src.Addr())
			c.Abort()
			return nil
		}
	}
	s, err := l.Open(&o, c)
	if err != nil {
		g.sources.release(o.Src.Addr())
		g.refuseLAN(c, "no_link", "open on WAN link failed", "err", err)
		return nil
	}
	if !o.Resume.IsZero() {
		s.ResetOnBreak()
	}
	g.m.streamsOpened.WithLabelValues(peerName(dsite.Name, int(l.Peer().Gateway)), "out").Inc()
	g.log.Debug("stream open", "dir", "out", "peer", dsite.Name, "stream", s.ID(), "src", o.Src.String(), "dst", o.Dst.String())
	return s
}

// resumeVerdict is the body of the OPEN_REPLY a gateway answers a LAN OPEN
// with ExtResume: 1 if the stream goes on resumable, 0 if plain.
func resumeVerdict(ok bool) []byte {
	if ok {
		return []byte{1}
	}
	return []byte{0}
}

// openFromWAN handles a peer's OPEN: the destination must be a node of our
// site and the source a node of the peer's site. The connect runs on its own
// goroutine; DATA the peer pipelined waits in the stream's window meanwhile.
func (g *Gateway) openFromWAN(s *relay.Stream, o *header.Open) {
	if !o.Resume.IsZero() {
		s.ResetOnBreak()
	}
	ph := s.Link().Peer()
	fromSite := ph.SiteID
	m, p := g.curMap(), g.peer(peerID{fromSite, int(ph.Gateway)})
	if g.draining.Load() || p == nil {
		// p == nil: a reload took the peer out of the map; its streams
		// drain, and it opens no new one.
		s.Refuse(header.CodeShutdown)
		return
	}
	psite := p.site
	o.Dst, o.Src = unmapAP(o.Dst), unmapAP(o.Src)
	if d, ok := m.Lookup(o.Dst.Addr()); !ok || d.ID != g.site.ID {
		g.refused("wan_open_dst", "WAN OPEN refused: destination not in this site", "peer", psite.Name, "src", o.Src.String(), "dst", o.Dst.String())
		s.Refuse(header.CodePolicy)
		return
	}
	if gs, ok := m.GatewaySite(o.Dst.Addr()); ok {
		g.refused("dst_gateway", "WAN OPEN refused: destination is a gateway: gateways are never relayed to (a loop)",
			"peer", psite.Name, "src", o.Src.String(), "dst", o.Dst.String(), "gateway_site", gs.Name)
		s.Refuse(header.CodePolicy)
		return
	}
	if !g.admitsDst(o.Dst) {
		g.refused("dst_port", "WAN OPEN refused: no rank listens at the destination (LISTEN) and its port is outside --wan-allow-ports",
			"peer", psite.Name, "src", o.Src.String(), "dst", o.Dst.String(), "allowed", g.cfg.AllowPorts.String())
		s.Refuse(header.CodePolicy)
		return
	}
	if src, ok := m.Lookup(o.Src.Addr()); !ok || src.ID != fromSite {
		g.refused("wan_open_src", "WAN OPEN refused: source not in the peer's site", "peer", psite.Name, "src", o.Src.String())
		s.Refuse(header.CodePolicy)
		return
	}
	if !takeSlot(&p.streamsIn, g.cfg.MaxPeerStreams) {
		g.refused("peer_streams", "WAN OPEN refused: the peer site has too many streams open into this site",
			"peer", psite.Name, "limit", g.cfg.MaxPeerStreams)
		s.Refuse(header.CodeLimit)
		return
	}
	go func() {
		streaming := false
		defer func() {
			if !streaming {
				p.streamsIn.Add(-1)
			}
		}()
		ctx, cancel := context.WithTimeout(g.ctx, g.cfg.DialTimeout)
		defer cancel()
		var key recordKey
		c, err := g.lan.Dial(ctx, g.me.LAN.Addr(), o.Dst, o.Resume, func(local netip.AddrPort) {
			key = recordKey{local, o.Dst}
			g.records.put(key, record{src: o.Src, site: fromSite})
		})
		if err != nil {
			if key.local.IsValid() {
				g.records.del(key)
			}
			code := dialCode(err)
			g.refusals.Log(g.log, slog.LevelInfo, "dst_connect", "destination connect failed", "dst", o.Dst.String(), "code", code.String(), "err", err)
			s.Refuse(code)
			return
		}
		if err := s.Accept(c); err != nil {
			c.Abort()
			g.records.del(key)
			return
		}
		g.m.streamsOpened.WithLabelValues(p.name, "in").Inc()
		streaming = true // its end is waited for without a goroutine
		s.AfterDone(func() {
			g.records.del(key)
			p.streamsIn.Add(-1)
		})
	}()
}

func dialCode(err error) header.Code {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return header.CodeRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return header.CodeUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return header.CodeTimedOut
	case errors.Is(err, context.Canceled):
		return header.CodeShutdown
	}
	return header.CodeUnreachable
}

// ---- true-source records for PEER_QUERY ----

type recordKey struct{ local, dst netip.AddrPort }

type record struct {
	src  netip.AddrPort
	site uint8
}

type peerTable struct {
	mu     sync.Mutex
	m      map[recordKey]record
	locals map[netip.AddrPort]int // the local ends of m's keys
}

func (t *peerTable) put(k recordKey, r record) {
	t.mu.Lock()
	if _, dup := t.m[k]; !dup {
		t.locals[k.local]++
	}
	t.m[k] = r
	t.mu.Unlock()
}

func (t *peerTable) del(k recordKey) {
	t.mu.Lock()
	if _, ok := t.m[k]; ok {
		delete(t.m, k)
		if t.locals[k.local]--; t.locals[k.local] <= 0 {
			delete(t.locals, k.local)
		}
	}
	t.mu.Unlock()
}

// isLocal reports whether ap is the local end of a connection the
// gateway dialed to a destination.
func (t *peerTable) isLocal(ap netip.AddrPort) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.locals[ap] > 0
}

// sourceTable counts what each LAN source host holds of a per-host limit:
// open streams (MaxSourceStreams), connections before their first frame
// (MaxSourcePending), control connections (MaxSourceControl). A host
// holding nothing has no entry, so the table is bounded by the
// connections behind it.
type sourceTable struct {
	mu sync.Mutex
	m  map[netip.Addr]int
}

func (t *sourceTable) acquire(a netip.Addr, max int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[a] >= max {
		return false
	}
	if t.m == nil {
		t.m = map[netip.Addr]int{}
	}
	t.m[a]++
	return true
}

func (t *sourceTable) release(a netip.Addr) {
	t.mu.Lock()
	if t.m[a]--; t.m[a] <= 0 {
		delete(t.m, a)
	}
	t.mu.Unlock()
}

func (t *peerTable) get(k recordKey) (record, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.m[k]
	return r, ok
}

// idleWatch closes a control connection that sends nothing for
// ControlIdle while it holds no LISTEN registration. One that holds some
// is never idled out: its registrations are what lets streams from other
// sites reach the rank's ports, and the shim keeps it for the process's
// life without a keepalive. The per-host MaxSourceControl bounds those.
type idleWatch struct {
	t      *time.Timer
	d      time.Duration
	closed atomic.Bool
}

// watchIdle returns c's idle watch, disarmed.
func (g *Gateway) watchIdle(c LANConn) *idleWatch {
	w := &idleWatch{d: g.cfg.ControlIdle}
	w.t = time.AfterFunc(time.Hour, func() {
		w.closed.Store(true)
		g.m.refusals.WithLabelValues("control_idle").Inc()
		g.refusals.Log(g.log, slog.LevelInfo, "control_idle", "LAN control connection closed: idle and holding no LISTEN port",
			"remote", c.Remote().String(), "idle", g.cfg.ControlIdle)
		c.Abort()
	})
	w.t.Stop()
	return w
}

// wait arms the watch before the connection's next read, unless the
// connection holds LISTEN registrations (registered).
func (w *idleWatch) wait(registered bool) {
	if registered {
		w.t.Stop()
	} else {
		w.t.Reset(w.d)
	}
}

// stop disarms the watch for good.
func (w *idleWatch) stop() { w.t.Stop() }

// fired reports whether the watch closed the connection.
func (w *idleWatch) fired() bool { return w.closed.Load() }
