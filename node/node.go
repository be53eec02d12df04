// Package node is the per-node daemon of the MX LAN transport (`mpi5k
// node`, docs/architecture.md): it owns the node's one MX engine and
// carries the ranks' inter-site connections between loopback TCP, where
// the shim hands them over exactly as it hands them to a TCP gateway, and
// MX streams to the site gateway (gateway.MXTransport).
//
// Toward the gateway, a rank's connection becomes one stream whose open
// metadata names the rank's end as the gateway would see it over TCP (the
// node's LAN address and the rank socket's port) and the gateway's LAN
// address; the first frame (OPEN, or PEER_QUERY/LISTEN of a control
// connection) is checked and forwarded with the rank's end rewritten from
// loopback to that address. From the gateway, a stream for a rank of this
// node becomes a TCP connection to the rank's port from the daemon's
// loopback address, which the shim takes for a gateway's and asks about
// (PEER_QUERY): the daemon translates the query into the gateway's terms.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
)

// Config is one daemon's setting.
type Config struct {
	// Addr is the node's address on the site LAN: the source the gateway
	// sees for the node's ranks.
	Addr netip.Addr
	// Listen is the loopback address the shim connects to (MPI5K_NODE);
	// connections to ranks are made from its address too.
	Listen netip.AddrPort
	// GatewayLAN is the site gateway's LAN address (the site map's lan=),
	// which every stream's metadata names.
	GatewayLAN netip.AddrPort
	// EP is the node's MX endpoint; Gateway the gateway's.
	EP      *mx.Endpoint
	Gateway mx.Addr
	Stream  mx.StreamConfig
	// MaxConns bounds the connections carried at once, both directions
	// together (default 4096); more are reset.
	MaxConns int
	// FirstFrame bounds the wait for a rank's first frame (default 10 s).
	FirstFrame time.Duration
	// DialTimeout bounds a connect to a rank's port (default 5 s).
	DialTimeout time.Duration
	Log         *slog.Logger
}

func (c *Config) defaults() {
	if c.MaxConns <= 0 {
		c.MaxConns = 4096
	}
	if c.FirstFrame <= 0 {
		c.FirstFrame = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Daemon carries connections until its context ends.
type Daemon struct {
	cfg   Config
	ln    *net.TCPListener
	conns atomic.Int64

	// in maps the daemon's end of a connection it made to a rank to the
	// stream's ends in the gateway's terms, for PEER_QUERY.
	inMu sync.Mutex
	in   map[netip.AddrPort]inbound

	wg sync.WaitGroup
}

type inbound struct{ from, to netip.AddrPort }

// New checks cfg and opens the loopback listener.
func New(cfg Config) (*Daemon, error) {
	cfg.defaults()
	switch {
	case !cfg.Addr.IsValid():
		return nil, errors.New("no node address (the node's address on the site LAN)")
	case !cfg.Listen.Addr().IsLoopback():
		return nil, fmt.Errorf("listen address %v: want a loopback address (only this node's ranks may connect)", cfg.Listen)
	case !cfg.GatewayLAN.IsValid():
		return nil, errors.New("no gateway LAN address")
	case cfg.EP == nil:
		return nil, errors.New("no MX endpoint")
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(cfg.Listen))
	if err != nil {
		return nil, fmt.Errorf("listen %v: %w", cfg.Listen, err)
	}
	return &Daemon{cfg: cfg, ln: ln, in: map[netip.AddrPort]inbound{}}, nil
}

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

// fromRank reads a rank's first frame and carries the connection to the
// gateway.
func (d *Daemon) fromRank(ctx context.Context, c *net.TCPConn) {
	c.SetNoDelay(true)
	c.SetLinger(0) // until a graceful close: see closeGracefully
	remote := unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	c.SetReadDeadline(time.Now().Add(d.cfg.FirstFrame))
	// Exactly one frame: what follows OPEN belongs to the stream.
	h, body, err := header.ReadOne(c, header.MaxPayload)
	if err != nil {
		d.cfg.Log.Info("rank connection refused: no valid first frame", "remote", remote.String(), "err", err)
		reset(c)
		return
	}
	c.SetReadDeadline(time.Time{})
	src := d.nodeView(remote)
	var first []byte
	switch h.Type {
	case header.TypeOpen:
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
		body, err := header.AppendOpen(nil, &o)
		if err != nil {
			reset(c)
			return
		}
		first = header.AppendFrame(nil, header.TypeOpen, h.Stream, body)
	case header.TypePeerQuery, header.TypeListen:
		first = d.controlFrame(h, body)
	default:
		d.cfg.Log.Info("rank connection refused: first frame must be OPEN, PEER_QUERY or LISTEN", "remote", remote.String(), "type", h.Type.String())
		reset(c)
		return
	}
	m, err := header.AppendEndpointPair(nil, src, d.cfg.GatewayLAN)
	if err != nil {
		reset(c)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	s, err := mx.Dial(dctx, d.cfg.EP, d.cfg.Gateway, m, d.cfg.Stream)
	cancel()
	if err != nil {
		d.cfg.Log.Warn("gateway unreachable over MX", "gateway", d.cfg.Gateway.String(), "remote", remote.String(), "err", err)
		reset(c)
		return
	}
	if _, err := s.Write(first); err != nil {
		s.Abort()
		reset(c)
		return
	}
	// The daemon's end ends every connection it carries.
	defer context.AfterFunc(ctx, func() { s.Abort(); reset(c) })()
	if h.Type == header.TypeOpen {
		splice(c, s)
		return
	}
	d.control(c, s)
}

// controlFrame re-encodes one frame of a control connection for the
// gateway: a PEER_QUERY about a connection the daemon made names the
// stream's ends instead of the loopback ones the rank saw.
func (d *Daemon) controlFrame(h header.Header, body []byte) []byte {
	if h.Type == header.TypePeerQuery {
		if q, err := header.ParsePeerQuery(body); err == nil {
			d.inMu.Lock()
			in, ok := d.in[unmap(q.Seen)]
			d.inMu.Unlock()
			if ok {
				body = header.AppendPeerQuery(nil, &header.PeerQuery{Seen: in.from, Local: in.to})
			}
		}
	}
	return header.AppendFrame(nil, h.Type, h.Stream, body)
}

// control carries a control connection: frames from the rank one at a
// time (rewritten), the gateway's replies as they come.
func (d *Daemon) control(c *net.TCPConn, s *mx.Stream) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(c, s); err != nil {
			reset(c)
			return
		}
		c.CloseWrite()
	}()
	r := header.NewReader(c, header.MaxControl)
	var buf [64]byte
	for {
		h, body, err := r.ReadFrame(buf[:])
		if err != nil {
			if errors.Is(err, io.EOF) {
				s.CloseWrite()
			} else {
				s.Abort()
			}
			break
		}
		if h.Type != header.TypePeerQuery && h.Type != header.TypeListen {
			s.Abort()
			break
		}
		if _, err := s.Write(d.controlFrame(h, body)); err != nil {
			break
		}
	}
	<-done
	closeGracefully(c)
	s.Close()
}

// fromGateway connects a stream the gateway opened to the rank's port it
// names, from the daemon's loopback address.
func (d *Daemon) fromGateway(ctx context.Context, s *mx.Stream) {
	from, to, err := header.ParseEndpointPair(s.Meta)
	from, to = unmap(from), unmap(to)
	if err == nil && s.Peer() != d.cfg.Gateway {
		err = fmt.Errorf("opened by %v, not the site gateway %v", s.Peer(), d.cfg.Gateway)
	}
	if err == nil && to.Addr() != d.cfg.Addr {
		err = fmt.Errorf("destination %v is not this node's address %v", to, d.cfg.Addr)
	}
	if err != nil {
		d.cfg.Log.Info("stream from the gateway refused", "err", err)
		s.Abort()
		return
	}
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
			d.in[local] = inbound{from, to}
			d.inMu.Unlock()
		}
		return err
	}}
	defer func() {
		if local.IsValid() {
			d.inMu.Lock()
			delete(d.in, local)
			d.inMu.Unlock()
		}
	}()
	network := "tcp4"
	if !to.Addr().Is4() {
		network = "tcp6"
	}
	c0, err := dl.DialContext(ctx, network, to.String())
	if err != nil {
		d.cfg.Log.Info("rank port unreachable", "dst", to.String(), "err", err)
		s.Abort()
		return
	}
	c := c0.(*net.TCPConn)
	c.SetNoDelay(true)
	c.SetLinger(0) // until a graceful close: see closeGracefully
	defer context.AfterFunc(ctx, func() { s.Abort(); reset(c) })()
	splice(c, s)
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
