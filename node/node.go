// Package node is the per-node daemon of the MX LAN transport (`mpi5k
// node`, docs/architecture.md): it owns the node's one MX engine and
// carries the ranks' inter-site connections between loopback TCP, where
// the shim hands them over exactly as it hands them to a TCP gateway, and
// MX streams to the site's gateways (gateway.MXTransport).
//
// A site may have several gateway hosts (the site map's gateway records).
// The daemon then spreads the ranks' new connections over them as the
// shim does over TCP gateways: round robin from a random start, a gateway
// whose dial failed last for a few seconds, the next one tried within the
// dial timeout. It accepts streams from every one of them, and a
// PEER_QUERY goes to the gateway that carries the connection it asks
// about; a LISTEN goes to all of them, since the far site's gateway may
// pick any of them for a stream to the port.
//
// Toward a gateway, a rank's connection becomes one stream whose open
// metadata names the rank's end as the gateway would see it over TCP (the
// node's LAN address and the rank socket's port) and that gateway's LAN
// address; the first frame (OPEN, or PEER_QUERY/LISTEN of a control
// connection) is checked and forwarded with the rank's end rewritten from
// loopback to that address. From the gateway, a stream for a rank of this
// node becomes a TCP connection to the rank's port from the daemon's
// loopback address, which the shim takes for a gateway's and asks about
// (PEER_QUERY): the daemon translates the query into the gateway's terms.
//
// Between two sites whose gateways both deliver to node daemons, a rank's
// connection is resumable (resume.go): the two daemons frame its bytes
// and keep what the other has not acknowledged, so it outlives the
// gateway hosts that carry it.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/ratelog"
	"github.com/mpi5k/mpi5k/internal/spread"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Gateway is one gateway host of the node's site, as the daemon reaches it.
type Gateway struct {
	// LAN is the gateway's LAN address in the site map (lan=), which the
	// metadata of every stream to it names.
	LAN netip.AddrPort
	// MX is the gateway's MX endpoint.
	MX mx.Addr
}

// Config is one daemon's setting. The zero value of a field means its
// default (DefaultConfig); New fills zero fields from it and calls
// Validate.
type Config struct {
	// Addr is the node's address on the site LAN: the source the gateways
	// see for the node's ranks.
	Addr netip.Addr
	// Listen is the loopback address the shim connects to (MPI5K_NODE);
	// connections to ranks are made from its address too.
	Listen netip.AddrPort
	// Gateways are the site's gateway hosts the daemon reaches, at least
	// one: new connections spread over them, and streams from any of them
	// are accepted (from no other endpoint).
	Gateways []Gateway
	// EP is the node's MX endpoint.
	EP     *mx.Endpoint
	Stream mx.StreamConfig
	// MaxConns bounds the connections carried at once, both directions
	// together (default 4096); more are reset.
	MaxConns int
	// FirstFrame bounds the wait for a rank's first frame (default 10 s).
	FirstFrame time.Duration
	// DialTimeout bounds a connect to a rank's port, and the stream open
	// of a rank's connection over all the gateways tried (default 5 s).
	DialTimeout time.Duration
	// NoResume opens plain streams: a rank's connection then ends with
	// the gateway hosts that carry it. By default the daemon asks for a
	// resumable one (resume.go), which the gateways grant when the far
	// site's gateways deliver to node daemons too.
	NoResume bool
	// ResumeWindow bounds the bytes of a resumable connection sent and not
	// yet acknowledged by the other daemon, per direction (default 8 MiB):
	// what it can resend, and the most it has in flight end to end.
	ResumeWindow int
	// Hold is how long a resumable connection whose stream broke waits for
	// another: the opening daemon keeps trying the site's gateways, the
	// accepting one holds the rank's socket (default 30 s).
	Hold time.Duration
	Log  *slog.Logger
}

// DefaultConfig returns the defaults Config's fields document. The
// addresses, the gateways and the endpoint are the caller's; Stream's
// zero fields take mx.DefaultStreamConfig's, and a nil Log discards.
func DefaultConfig() Config {
	return Config{
		MaxConns:     4096,
		FirstFrame:   10 * time.Second,
		DialTimeout:  5 * time.Second,
		ResumeWindow: 8 << 20,
		Hold:         30 * time.Second,
	}
}

// fillDefaults gives zero fields their defaults (DefaultConfig).
func (c *Config) fillDefaults() {
	d := DefaultConfig()
	c.MaxConns = cmp.Or(c.MaxConns, d.MaxConns)
	c.FirstFrame = cmp.Or(c.FirstFrame, d.FirstFrame)
	c.DialTimeout = cmp.Or(c.DialTimeout, d.DialTimeout)
	c.ResumeWindow = cmp.Or(c.ResumeWindow, d.ResumeWindow)
	c.Hold = cmp.Or(c.Hold, d.Hold)
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Validate reports the first setting missing or out of range, zero
// fields standing for their defaults.
func (c *Config) Validate() error {
	switch {
	case !c.Addr.IsValid():
		return errors.New("no node address (the node's address on the site LAN)")
	case !c.Listen.Addr().IsLoopback():
		return fmt.Errorf("listen address %v: want a loopback address (only this node's ranks may connect)", c.Listen)
	case len(c.Gateways) == 0:
		return errors.New("no gateway")
	case len(c.Gateways) > sitemap.MaxGateways:
		return fmt.Errorf("%d gateways: a site has at most %d", len(c.Gateways), sitemap.MaxGateways)
	case c.EP == nil:
		return errors.New("no MX endpoint")
	}
	for _, g := range c.Gateways {
		if !g.LAN.IsValid() {
			return fmt.Errorf("gateway %v: no LAN address", g.MX)
		}
	}
	for _, f := range []struct {
		name string
		neg  bool
		v    any
	}{{"MaxConns", c.MaxConns < 0, c.MaxConns}, {"FirstFrame", c.FirstFrame < 0, c.FirstFrame},
		{"DialTimeout", c.DialTimeout < 0, c.DialTimeout}, {"ResumeWindow", c.ResumeWindow < 0, c.ResumeWindow},
		{"Hold", c.Hold < 0, c.Hold}} {
		if f.neg {
			return fmt.Errorf("%s %v is negative: give a positive value, or 0 for its default (DefaultConfig)", f.name, f.v)
		}
	}
	return c.Stream.Validate()
}

// Daemon carries connections until its context ends.
type Daemon struct {
	cfg   Config
	ln    *net.TCPListener
	conns atomic.Int64

	// in maps the daemon's end of a connection it made to a rank to the
	// stream's ends in its gateway's terms, and that gateway, for
	// PEER_QUERY.
	inMu sync.Mutex
	in   map[netip.AddrPort]inbound

	// order spreads new connections over cfg.Gateways, as the shim does
	// over TCP gateways.
	order spread.Order

	// owner checks that the user holding a rank's end of a control
	// connection holds the port it registers (listenOwner).
	owner    func(rank, daemon netip.AddrPort, node netip.Addr, port uint16) error
	refusals ratelog.Limiter // of LISTENs: a local user may send thousands

	// sessions are the resumable connections this daemon accepted, by id,
	// for the streams that resume them.
	sessMu   sync.Mutex
	sessions map[header.ResumeID]*session
	resumes  atomic.Int64

	wg sync.WaitGroup
}

type inbound struct {
	from, to netip.AddrPort
	gw       int // index in cfg.Gateways of the gateway that opened the stream
}

// New checks cfg (Validate), its zero fields taking their defaults, and
// opens the loopback listener.
func New(cfg Config) (*Daemon, error) {
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(cfg.Listen))
	if err != nil {
		return nil, fmt.Errorf("listen %v: %w", cfg.Listen, err)
	}
	return &Daemon{cfg: cfg, ln: ln, in: map[netip.AddrPort]inbound{}, sessions: map[header.ResumeID]*session{}, owner: listenOwner}, nil
}

// Resumes counts the streams that took over a resumable connection
// after its stream broke, at either end.
func (d *Daemon) Resumes() int64 { return d.resumes.Load() }

// Addr is the loopback address the daemon listens on.
func (d *Daemon) Addr() netip.AddrPort { return d.ln.Addr().(*net.TCPAddr).AddrPort() }

// Run serves until ctx ends, then closes the listener and waits for the
// connections being carried to end.
func (d *Daemon) Run(ctx context.Context) error {
	mln, err := mx.Listen(d.cfg.EP, d.cfg.Stream)
	if err != nil {
		d.ln.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); d.ln.Close() }()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			s, err := mln.Accept(ctx)
			if err != nil {
				return
			}
			if !d.take() {
				d.cfg.Log.Warn("stream from the gateway refused: too many connections", "limit", d.cfg.MaxConns)
				s.Abort()
				continue
			}
			d.wg.Add(1)
			go func() { defer d.wg.Done(); defer d.conns.Add(-1); d.fromGateway(ctx, s) }()
		}
	}()
	for {
		c, err := d.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			d.cfg.Log.Warn("loopback accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !d.take() {
			d.cfg.Log.Warn("rank connection refused: too many connections", "limit", d.cfg.MaxConns)
			reset(c)
			continue
		}
		d.wg.Add(1)
		go func() { defer d.wg.Done(); defer d.conns.Add(-1); d.fromRank(ctx, c) }()
	}
	cancel()
	d.wg.Wait()
	return nil
}

func (d *Daemon) take() bool {
	if d.conns.Add(1) > int64(d.cfg.MaxConns) {
		d.conns.Add(-1)
		return false
	}
	return true
}

// reset closes c with RST, so a rank whose connection was cut sees
// ECONNRESET rather than an end of file.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// closeGracefully closes a connection whose both directions ended. A
// rank's connection carries SO_LINGER 0 until then, so that if the daemon
// dies (SIGKILL, OOM) the kernel resets it: the rank sees ECONNRESET, not
// an end of file that makes a cut stream look complete.
func closeGracefully(c *net.TCPConn) {
	c.SetLinger(-1)
	c.Close()
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// nodeView is the rank's end of c as the gateway would see it over TCP:
// a socket on loopback stands for the node's LAN address with its port;
// one the rank bound to another address of the node keeps it.
func (d *Daemon) nodeView(remote netip.AddrPort) netip.AddrPort {
	if remote.Addr().IsLoopback() {
		return netip.AddrPortFrom(d.cfg.Addr, remote.Port())
	}
	return remote
}

// fromRank reads a rank's first frame and carries the connection to a
// gateway (OPEN) or to the gateways (a control connection).
func (d *Daemon) fromRank(ctx context.Context, c *net.TCPConn) {
	c.SetNoDelay(true)
	c.SetLinger(0) // until a graceful close: see closeGracefully
	remote := unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	c.SetReadDeadline(time.Now().Add(d.cfg.FirstFrame))
	// Exactly one frame: what follows OPEN belongs to the stream. Any
	// local user can connect, so the frame's type and length are checked
	// before its body is read (at most a control frame).
	h, body, err := header.ReadFirst(c, header.TypeOpen, header.TypePeerQuery, header.TypeListen)
	if err != nil {
		d.cfg.Log.Info("rank connection refused: no valid first frame", "remote", remote.String(), "err", err)
		reset(c)
		return
	}
	c.SetReadDeadline(time.Time{})
	src := d.nodeView(remote)
	switch h.Type {
	case header.TypeOpen:
	case header.TypePeerQuery, header.TypeListen:
		d.control(ctx, c, src, h, body)
		return
	default:
		d.cfg.Log.Info("rank connection refused: first frame must be OPEN, PEER_QUERY or LISTEN", "remote", remote.String(), "type", h.Type.String())
		reset(c)
		return
	}
	o, err := header.ParseOpen(body)
	if err == nil && unmap(o.Src) != remote {
		err = fmt.Errorf("OPEN source %v differs from the connection's source %v", o.Src, remote)
	}
	if err != nil {
		d.cfg.Log.Info("rank connection refused: bad OPEN", "remote", remote.String(), "err", err)
		reset(c)
		return
	}
	o.Src = src
	if !d.cfg.NoResume {
		o.Resume = newResumeID()
	}
	if body, err = header.AppendOpen(nil, &o); err != nil {
		reset(c)
		return
	}
	first := header.AppendFrame(nil, header.TypeOpen, h.Stream, body)
	open := func(ctx context.Context) (*mx.Stream, bool, error) {
		resumable := false
		s, gw, err := d.dial(ctx, src, func(s *mx.Stream) error {
			if _, err := s.Write(first); err != nil {
				return err
			}
			if !o.Resume.IsZero() {
				// A gateway that dies before it answers is passed over
				// like one that does not open: the same id then opens
				// the connection, or takes it over if the far daemon
				// got the first OPEN.
				var err error
				resumable, err = d.readVerdict(s)
				return err
			}
			return nil
		})
		if err != nil {
			return nil, false, err
		}
		d.cfg.Log.Debug("stream to the gateway", "gateway", d.cfg.Gateways[gw].LAN.String(), "src", src.String(), "dst", o.Dst.String(), "resumable", resumable)
		return s, resumable, nil
	}
	s, resumable, err := open(ctx)
	if err != nil {
		d.cfg.Log.Warn("no gateway reachable over MX", "remote", remote.String(), "err", err)
		reset(c)
		return
	}
	if resumable {
		ss := d.newSession(o.Resume, c, true)
		ss.redial = func(ctx context.Context) (*mx.Stream, error) {
			s, ok, err := open(ctx)
			if err == nil && !ok {
				s.Abort()
				err = errors.New("the gateway can no longer carry the connection resumably")
			}
			return s, err
		}
		ss.open(s)
		ss.run(ctx)
		return
	}
	// The daemon's end ends every connection it carries.
	defer context.AfterFunc(ctx, func() { s.Abort(); reset(c) })()
	splice(c, s)
}

// readVerdict reads the gateway's answer to an OPEN with a resume id: an
// OPEN_REPLY whose one byte says whether the stream goes on resumable.
func (d *Daemon) readVerdict(s *mx.Stream) (bool, error) {
	t := time.AfterFunc(d.cfg.DialTimeout, func() { s.Abort() })
	defer t.Stop()
	h, body, err := header.ReadOne(s, 16)
	if err == nil && (h.Type != header.TypeOpenReply || body[0] > 1) {
		err = fmt.Errorf("gateway answered a resumable OPEN with %v %x, not OPEN_REPLY 0 or 1", h.Type, body)
	}
	if err != nil {
		return false, err
	}
	return body[0] == 1, nil
}

// gatewayOrder is the order in which a new connection tries the site's
// gateways (spread.Order).
func (d *Daemon) gatewayOrder() []int { return d.order.Next(len(d.cfg.Gateways)) }

// dial opens a stream from the rank's end src to one of the site's
// gateways, in gatewayOrder, trying the next when one fails, all within
// DialTimeout: each attempt gets an equal share of what is left, so a
// gateway that does not answer leaves time for the others. then, if not
// nil, runs on each opened stream; its error counts as the gateway's. It
// returns the stream and its gateway's index, or the last error.
func (d *Daemon) dial(ctx context.Context, src netip.AddrPort, then func(*mx.Stream) error) (*mx.Stream, int, error) {
	order := d.gatewayOrder()
	deadline := time.Now().Add(d.cfg.DialTimeout)
	var err error
	for k, i := range order {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		var s *mx.Stream
		if s, err = d.dialOne(ctx, i, src, left/time.Duration(len(order)-k)); err == nil && then != nil {
			if err = then(s); err != nil {
				s.Abort()
				err = fmt.Errorf("gateway %v: %w", d.cfg.Gateways[i].LAN, err)
			}
		}
		if err == nil {
			d.order.Succeeded(i)
			return s, i, nil
		}
		if ctx.Err() != nil {
			break
		}
		d.failed(i, err)
	}
	return nil, -1, err
}

// dialOne opens a stream from src to gateway i within timeout.
func (d *Daemon) dialOne(ctx context.Context, i int, src netip.AddrPort, timeout time.Duration) (*mx.Stream, error) {
	g := d.cfg.Gateways[i]
	m, err := header.AppendEndpointPair(nil, src, g.LAN)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s, err := mx.Dial(dctx, d.cfg.EP, g.MX, m, d.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("gateway %v (MX %v): %w", g.LAN, g.MX, err)
	}
	return s, nil
}

// failed puts gateway i last for new connections for spread.RetryAfter.
func (d *Daemon) failed(i int, err error) {
	d.order.Failed(i)
	if len(d.cfg.Gateways) > 1 {
		d.cfg.Log.Info("gateway unreachable over MX; new connections try the others first", "gateway", d.cfg.Gateways[i].LAN.String(), "err", err)
	}
}

// ctlReplyWait bounds how long a control connection waits for the other
// gateways once one has answered a frame (or, for the stream opens, once
// one has opened): a LAN round trip takes well under a millisecond, and
// the shim waits 2 s for the answer (MPI5K_TIMEOUT), so a gateway that
// died with its MX channel still open must not hold the answer until the
// channel's peer timeout.
const ctlReplyWait = time.Second

// ctlConn is a rank's control connection as the daemon carries it: one
// stream to each gateway it needs, opened when first needed and kept
// while the connection lasts, since a gateway's LISTEN registrations end
// with the stream that made them. A gateway whose stream failed is not
// used again on the connection.
type ctlConn struct {
	d   *Daemon
	src netip.AddrPort // the rank's end in the gateways' terms

	mu   sync.Mutex // s's elements for abort; the connection's goroutine writes them under mu
	s    []*mx.Stream
	gone []bool
}

// control carries a rank's control connection, whose first frame is h:
// each frame goes to its gateways and one answer back to the rank
// (exchange).
func (d *Daemon) control(ctx context.Context, c *net.TCPConn, src netip.AddrPort, h header.Header, body []byte) {
	cc := &ctlConn{d: d, src: src, s: make([]*mx.Stream, len(d.cfg.Gateways)), gone: make([]bool, len(d.cfg.Gateways))}
	defer context.AfterFunc(ctx, func() { cc.abort(); reset(c) })()
	rank, self := unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()), unmap(c.LocalAddr().(*net.TCPAddr).AddrPort())
	r := header.NewReader(c, header.MaxControl)
	var buf [64]byte
	for {
		var rep []byte
		var err error
		if h.Type == header.TypeListen {
			rep = d.refuseListen(rank, self, src.Addr(), h, body)
		}
		if rep == nil {
			rep, err = cc.exchange(ctx, h, body)
		}
		if err == nil {
			_, err = c.Write(rep)
		}
		if err != nil {
			d.cfg.Log.Info("rank control connection reset", "remote", src.String(), "frame", h.Type.String(), "err", err)
			cc.abort()
			reset(c)
			return
		}
		h, body, err = r.ReadFrame(buf[:])
		if err == nil && h.Type != header.TypePeerQuery && h.Type != header.TypeListen {
			err = fmt.Errorf("%v on a control connection", h.Type)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				cc.abort()
				reset(c)
				return
			}
			cc.close()
			c.CloseWrite()
			closeGracefully(c)
			return
		}
	}
}

// refuseListen answers a rank's LISTEN itself when the port is not the
// asking user's (listenOwner): the gateways cannot see a node's sockets,
// the daemon can. It returns nil when the LISTEN may go to the gateways
// (a malformed one too: they refuse it).
func (d *Daemon) refuseListen(rank, self netip.AddrPort, node netip.Addr, h header.Header, body []byte) []byte {
	port, err := header.ParseListen(body)
	if err != nil {
		return nil
	}
	if err := d.owner(rank, self, node, port); err != nil {
		d.refusals.Log(d.cfg.Log, slog.LevelWarn, "listen_owner", "LISTEN refused: the port is not the asking user's", "remote", rank.String(), "port", port, "err", err)
		return header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOwner})
	}
	return nil
}

func (cc *ctlConn) abort() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, s := range cc.s {
		if s != nil {
			s.Abort()
		}
	}
}

func (cc *ctlConn) close() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, s := range cc.s {
		if s != nil {
			s.Close()
		}
	}
}

// drop stops using gateway i on the connection. Unless the gateway
// ended the stream itself (it refuses a frame that way), it is also put
// last for new connections.
func (cc *ctlConn) drop(i int, err error) {
	cc.mu.Lock()
	if s := cc.s[i]; s != nil {
		s.Abort()
	}
	cc.s[i], cc.gone[i] = nil, true
	cc.mu.Unlock()
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		cc.d.cfg.Log.Info("gateway ended a control connection", "gateway", cc.d.cfg.Gateways[i].LAN.String(), "remote", cc.src.String())
		return
	}
	cc.d.failed(i, err)
}

// exchange sends one frame of the rank to its gateways and returns the
// answer for the rank: a PEER_QUERY about a connection the daemon made
// goes, in the stream's terms, to the gateway that opened that stream,
// one about any other connection to one gateway; a LISTEN goes to every
// gateway, and the answer is a refusal if one refused, else OK if one
// registered the port.
func (cc *ctlConn) exchange(ctx context.Context, h header.Header, body []byte) ([]byte, error) {
	d := cc.d
	var targets []int
	want := header.TypeListenReply
	if h.Type == header.TypePeerQuery {
		want = header.TypePeerReply
		gw := -1
		if q, err := header.ParsePeerQuery(body); err == nil {
			d.inMu.Lock()
			in, ok := d.in[unmap(q.Seen)]
			d.inMu.Unlock()
			if ok {
				body, gw = header.AppendPeerQuery(nil, &header.PeerQuery{Seen: in.from, Local: in.to}), in.gw
			}
		}
		if gw >= 0 {
			targets = []int{gw}
		} else {
			// Nobody knows the connection: any one gateway says so.
			targets = cc.anyGateway(ctx)
		}
	} else {
		for i := range d.cfg.Gateways {
			targets = append(targets, i)
		}
	}
	cc.open(ctx, targets)
	frame := header.AppendFrame(nil, h.Type, h.Stream, body)
	type reply struct {
		i    int
		h    header.Header
		body []byte
		err  error
	}
	replies := make(chan reply, len(targets))
	pending := map[int]bool{}
	for _, i := range targets {
		s := cc.s[i]
		if s == nil {
			continue
		}
		if _, err := s.Write(frame); err != nil {
			cc.drop(i, err)
			continue
		}
		pending[i] = true
		go func() {
			rh, rb, err := header.ReadOne(s, header.MaxControl)
			if err == nil && (rh.Type != want || rh.Stream != h.Stream) {
				err = fmt.Errorf("gateway answered %v %d to %v %d", rh.Type, rh.Stream, h.Type, h.Stream)
			}
			replies <- reply{i, rh, rb, err}
		}()
	}
	var out []byte
	var grace <-chan time.Time
	answered := 0
	for len(pending) > 0 {
		select {
		case r := <-replies:
			delete(pending, r.i)
			if r.err != nil {
				cc.drop(r.i, r.err)
				continue
			}
			answered++
			if grace == nil {
				grace = time.After(ctlReplyWait)
			}
			// The first answer, or the first refusal of a LISTEN.
			if out == nil || h.Type == header.TypeListen && r.body[0] != header.ListenOK && out[header.Size] == header.ListenOK {
				out = header.AppendFrame(nil, r.h.Type, r.h.Stream, r.body)
			}
		case <-grace:
			// A gateway that has not answered while another has is
			// dropped; its reader ends with its aborted stream.
			for i := range pending {
				cc.drop(i, fmt.Errorf("no answer to %v in %v", h.Type, ctlReplyWait))
				delete(pending, i)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if out == nil {
		return nil, errors.New("no gateway answered")
	}
	if h.Type == header.TypeListen && answered < len(d.cfg.Gateways) {
		d.cfg.Log.Warn("rank port registered with only some gateways: streams from other sites through the others are refused",
			"remote", cc.src.String(), "registered", answered, "gateways", len(d.cfg.Gateways))
	}
	return out, nil
}

// anyGateway is one gateway for a frame any of them answers: one whose
// stream is open, else the first in gatewayOrder that opens.
func (cc *ctlConn) anyGateway(ctx context.Context) []int {
	for i, s := range cc.s {
		if s != nil {
			return []int{i}
		}
	}
	all := make([]int, len(cc.s))
	for i := range all {
		all[i] = i
	}
	cc.open(ctx, all)
	for _, i := range cc.d.gatewayOrder() {
		if cc.s[i] != nil {
			return []int{i}
		}
	}
	return nil
}

// open opens the streams of targets that are not open, all at once
// within DialTimeout; once one has opened, the others get ctlReplyWait
// more. A gateway whose stream does not open is not used again on the
// connection.
func (cc *ctlConn) open(ctx context.Context, targets []int) {
	type opened struct {
		i   int
		s   *mx.Stream
		err error
	}
	ch := make(chan opened, len(targets))
	dctx, cancel := context.WithTimeout(ctx, cc.d.cfg.DialTimeout)
	defer cancel()
	n := 0
	for _, i := range targets {
		if cc.s[i] != nil || cc.gone[i] {
			continue
		}
		n++
		go func() {
			s, err := cc.d.dialOne(dctx, i, cc.src, cc.d.cfg.DialTimeout)
			ch <- opened{i, s, err}
		}()
	}
	var grace *time.Timer
	for range n {
		o := <-ch
		if o.err != nil {
			cc.drop(o.i, o.err)
			continue
		}
		cc.mu.Lock()
		cc.s[o.i] = o.s
		cc.mu.Unlock()
		if grace == nil {
			grace = time.AfterFunc(ctlReplyWait, cancel)
			defer grace.Stop()
		}
	}
}

// fromGateway connects a stream a gateway opened to the rank's port it
// names, from the daemon's loopback address.
func (d *Daemon) fromGateway(ctx context.Context, s *mx.Stream) {
	from, to, id, err := header.ParseStreamMeta(s.Meta)
	from, to = unmap(from), unmap(to)
	gw := slices.IndexFunc(d.cfg.Gateways, func(g Gateway) bool { return g.MX == s.Peer() })
	if err == nil && gw < 0 {
		err = fmt.Errorf("opened by %v, not a gateway of the site", s.Peer())
	}
	if err == nil && to.Addr() != d.cfg.Addr {
		err = fmt.Errorf("destination %v is not this node's address %v", to, d.cfg.Addr)
	}
	if err != nil {
		d.cfg.Log.Info("stream from the gateway refused", "err", err)
		s.Abort()
		return
	}
	if !id.IsZero() {
		d.acceptResumable(ctx, s, from, to, gw, id)
		return
	}
	c, done, err := d.dialRank(ctx, from, to, gw)
	if err != nil {
		d.cfg.Log.Info("rank port unreachable", "dst", to.String(), "err", err)
		s.Abort()
		return
	}
	defer done()
	defer context.AfterFunc(ctx, func() { s.Abort(); reset(c) })()
	splice(c, s)
}

// dialRank connects to the rank's port to for a stream from the gateway
// gw, whose far end is from; done forgets the connection's PEER_QUERY
// record once it has ended.
func (d *Daemon) dialRank(ctx context.Context, from, to netip.AddrPort, gw int) (*net.TCPConn, func(), error) {
	var local netip.AddrPort
	dl := net.Dialer{Timeout: d.cfg.DialTimeout, Control: func(_, _ string, rc syscall.RawConn) error {
		// Bind and record the daemon's end before connect, so the rank's
		// PEER_QUERY right after accept finds it.
		var err error
		cerr := rc.Control(func(fd uintptr) {
			if err = bindLoopback(int(fd), d.cfg.Listen.Addr()); err != nil {
				return
			}
			local, err = sockName(int(fd))
		})
		if err == nil {
			err = cerr
		}
		if err == nil {
			d.inMu.Lock()
			d.in[local] = inbound{from, to, gw}
			d.inMu.Unlock()
		}
		return err
	}}
	done := func() {
		if local.IsValid() {
			d.inMu.Lock()
			delete(d.in, local)
			d.inMu.Unlock()
		}
	}
	network := "tcp4"
	if !to.Addr().Is4() {
		network = "tcp6"
	}
	c0, err := dl.DialContext(ctx, network, to.String())
	if err != nil {
		done()
		return nil, nil, err
	}
	c := c0.(*net.TCPConn)
	c.SetNoDelay(true)
	c.SetLinger(0) // until a graceful close: see closeGracefully
	return c, done, nil
}

// splice copies both ways until both directions end. An end of file is
// passed on as one (CloseWrite); an error resets the other side, so a cut
// stream never looks complete.
func splice(c *net.TCPConn, s *mx.Stream) {
	var failed atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(c, s); err != nil {
			failed.Store(true)
			reset(c)
			return
		}
		c.CloseWrite()
	}()
	if _, err := io.Copy(s, c); err != nil {
		failed.Store(true)
		s.Abort()
		reset(c)
	} else {
		s.CloseWrite()
	}
	<-done
	if failed.Load() {
		s.Abort()
		reset(c)
		return
	}
	closeGracefully(c)
	s.Close()
}

func bindLoopback(fd int, a netip.Addr) error {
	var sa unix.Sockaddr
	if a.Is4() {
		sa = &unix.SockaddrInet4{Addr: a.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: a.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind %v: %w", a, err)
	}
	return nil
}

func sockName(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, err
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, errors.New("unexpected socket address family")
}
