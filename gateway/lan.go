package gateway

// The LAN transport, behind which the gateway reaches the site's nodes
// (kernel TCP here, MX in lan_mx*.go):
//
//  1. initLAN (New): the configured transport, MX, or TCPTransport;
//  2. Listen, Accept: the node connections serveLAN takes (serve.go), as
//     LANConns, which the relay reads and writes (relay.Conn);
//  3. Dial: a destination for a stream a peer opens (openFromWAN), bound
//     and reported before it connects.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tuning"
)

// The LAN side is an interface so that a second LAN transport (MX-style
// messaging over raw Ethernet, see the design brief) can sit beside kernel
// TCP without touching the WAN side: the relay only sees relay.Conn.

// LANConn is one application connection on the LAN side.
type LANConn interface {
	relay.Conn
	Local() netip.AddrPort  // the gateway's end
	Remote() netip.AddrPort // the node's end
}

// LANListener accepts connections from the site's nodes.
type LANListener interface {
	Accept() (LANConn, error)
	Addr() netip.AddrPort
	Close() error
}

// LANTransport creates LAN listeners and connects to destinations.
type LANTransport interface {
	Listen(addr netip.AddrPort) (LANListener, error)
	// Dial connects from local (port chosen by the system) to dst. bound is
	// called with the local endpoint after bind and before connect, so the
	// gateway can record who stands behind it before the destination can
	// possibly ask (PEER_QUERY). A resume id that is not zero is passed to
	// the destination's node daemon (header.ExtResume); a transport that
	// reaches no node daemons refuses it.
	Dial(ctx context.Context, local netip.Addr, dst netip.AddrPort, resume header.ResumeID, bound func(netip.AddrPort)) (LANConn, error)
}

// errNoNodeResume refuses a resumable OPEN on a LAN without node daemons
// (a peer that does not send HELLO feature NODE_RESUME gets none).
var errNoNodeResume = errors.New("resumable stream, but the LAN transport reaches ranks, not node daemons")

// TCPTransport is the kernel TCP LAN transport.
type TCPTransport struct {
	Opts tuning.SockOpts
}

type tcpLANConn struct {
	relay.TCPConn
	local, remote netip.AddrPort
}

func (c *tcpLANConn) Local() netip.AddrPort  { return c.local }
func (c *tcpLANConn) Remote() netip.AddrPort { return c.remote }

// wrapTCP sets SO_LINGER 0 on c until a graceful Close: if the gateway
// dies (SIGKILL, OOM), the kernel closes its sockets with RST, so an
// application whose stream was cut sees ECONNRESET, not an end of file
// that makes a truncated stream look complete.
func wrapTCP(c *net.TCPConn) *tcpLANConn {
	c.SetLinger(0)
	return &tcpLANConn{TCPConn: relay.WrapTCP(c),
		local:  unmapAP(c.LocalAddr().(*net.TCPAddr).AddrPort()),
		remote: unmapAP(c.RemoteAddr().(*net.TCPAddr).AddrPort())}
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

type tcpListener struct {
	ln   *net.TCPListener
	opts tuning.SockOpts
}

// Listen opens a TCP listener with the LAN socket options.
func (t *TCPTransport) Listen(addr netip.AddrPort) (LANListener, error) {
	lc := net.ListenConfig{Control: t.Opts.Control(nil)}
	ln, err := lc.Listen(context.Background(), "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	return &tcpListener{ln: ln.(*net.TCPListener), opts: t.Opts}, nil
}

func (l *tcpListener) Accept() (LANConn, error) {
	c, err := l.ln.AcceptTCP()
	if err != nil {
		return nil, err
	}
	// Congestion control is not inherited from the listener on every
	// kernel; set it (and NODELAY) again.
	if err := l.opts.ApplyConn(c); err != nil {
		c.Close()
		return nil, err
	}
	return wrapTCP(c), nil
}

func (l *tcpListener) Addr() netip.AddrPort {
	return unmapAP(l.ln.Addr().(*net.TCPAddr).AddrPort())
}

func (l *tcpListener) Close() error { return l.ln.Close() }

// Dial binds to local:0, reports the bound endpoint, then connects.
func (t *TCPTransport) Dial(ctx context.Context, local netip.Addr, dst netip.AddrPort, resume header.ResumeID, bound func(netip.AddrPort)) (LANConn, error) {
	if !resume.IsZero() {
		return nil, errNoNodeResume
	}
	d := net.Dialer{Control: t.Opts.Control(func(fd int) error {
		// Bind here rather than with Dialer.LocalAddr: Control runs before
		// connect, so the record exists before the destination can accept.
		var sa unix.Sockaddr
		if local.Is4() {
			sa = &unix.SockaddrInet4{Addr: local.As4()}
		} else {
			sa = &unix.SockaddrInet6{Addr: local.As16()}
		}
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("bind %v: %w", local, err)
		}
		got, err := unix.Getsockname(fd)
		if err != nil {
			return err
		}
		var ap netip.AddrPort
		switch a := got.(type) {
		case *unix.SockaddrInet4:
			ap = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
		case *unix.SockaddrInet6:
			ap = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
		default:
			return errors.New("unexpected socket address family")
		}
		if bound != nil {
			bound(ap)
		}
		return nil
	})}
	network := "tcp4"
	if !local.Is4() {
		network = "tcp6"
	}
	c, err := d.DialContext(ctx, network, dst.String())
	if err != nil {
		return nil, err
	}
	return wrapTCP(c.(*net.TCPConn)), nil
}

// initLAN sets up the LAN transport: the configured one, MX on --lan-if,
// or kernel TCP with the LAN socket options.
func (g *Gateway) initLAN() error {
	g.lan = g.cfg.Transport
	if g.lan == nil && g.cfg.LANTransport == "mx" {
		t, err := newMXLAN(&g.cfg, g.site)
		if err != nil {
			return fmt.Errorf("gateway: --lan-transport mx: %w", err)
		}
		g.lan = t
	}
	if g.lan == nil {
		g.lan = &TCPTransport{Opts: g.cfg.LAN}
	}
	if t, ok := g.lan.(*MXTransport); ok {
		if t.Forward == "" {
			t.Forward = g.cfg.LANForward
		}
		t.refused = g.refused
	}
	return nil
}
