package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// MXTransport is the MX-style LAN transport (docs/mx-wire-format.md): each
// LAN connection is an mx.Stream on the gateway's endpoint, carrying the
// same bytes a kernel TCP connection would (OPEN, then the application's
// bytes). The open message of a stream names the IP endpoints it stands
// for, because MX addresses hosts by MAC and endpoint id: the node's end
// (the rank's address and port, which the gateway checks against its site
// like a TCP peer address) and the gateway's end. Which MACs may speak at
// all is the engine's Config.Allow; which node address a MAC may claim is
// Bind's.
type MXTransport struct {
	EP *mx.Endpoint
	// Bind checks that the host with MAC from holds the node address a
	// that a stream's open metadata claims: the claim is the node's word,
	// and a host that could claim another's address would register that
	// host's ports (LISTEN) and take over the streams meant for it
	// (learned). newMXLAN binds to the LAN interface's neighbour table
	// (neighbors.bind). With wait false Bind answers at once, an error
	// wrapping errUnresolved when it does not know a yet; with wait true
	// it may take up to bindWait to find out. Nil accepts every claim
	// (an in-memory LAN of tests).
	Bind func(a netip.Addr, from mx.MAC, wait bool) error
	// Resolve maps a node's IP address to the MX endpoint that carries its
	// streams (its node daemon). Needed by Dial only.
	Resolve func(netip.Addr) (mx.Addr, error)
	Stream  mx.StreamConfig
	// Forward is how the relay forwards its streams: LANForwardChunked
	// (also "") or LANForwardPipelined (lan_mx_pipe.go).
	Forward string

	mu        sync.Mutex
	listening bool
	port      atomic.Uint32
	// learned maps a node's address to the endpoint its streams come
	// from, once Bind held: a node daemon whose host has not spoken IP to
	// the gateway for long is absent from the neighbour table Resolve
	// reads, yet reachable.
	learned  sync.Map // netip.Addr -> mx.Addr
	nLearned atomic.Int32
	// mapChanged, if set, hears of a reloaded site map (Gateway.Reload):
	// the MACs the engine admits follow the site's hosts.
	mapChanged func(*sitemap.Map)
	// refused, if set, logs and counts a stream refused for reason
	// (Gateway.refused).
	refused func(reason, msg string, args ...any)
}

// errUnresolved wraps Bind's error for an address whose host it does not
// know yet.
var errUnresolved = errors.New("address not resolved")

// Bind's bounds: a claim Bind cannot answer at once waits up to bindWait
// on its own goroutine, at most maxBinding of them at a time; more are
// refused.
const (
	bindWait   = 500 * time.Millisecond
	maxBinding = 16
)

// maxLearned bounds learned: a site's hosts, with room to spare.
const maxLearned = 1 << 16

// forget drops the learned endpoints of the nodes keep rejects: after a
// reload takes a host out of the site, Dial must not reach its daemon
// through what an earlier stream taught.
func (t *MXTransport) forget(keep func(netip.Addr) bool) {
	t.learned.Range(func(k, _ any) bool {
		if a := k.(netip.Addr); !keep(a) {
			if _, had := t.learned.LoadAndDelete(a); had {
				t.nLearned.Add(-1)
			}
		}
		return true
	})
}

type mxLANConn struct {
	*mx.Stream
	local, remote netip.AddrPort
}

func (c *mxLANConn) Local() netip.AddrPort  { return c.local }
func (c *mxLANConn) Remote() netip.AddrPort { return c.remote }

type mxListener struct {
	t       *MXTransport
	ln      *mx.Listener
	addr    netip.AddrPort
	ctx     context.Context
	cancel  context.CancelFunc
	out     chan accepted // to Accept: streams whose claim held, in the order it did
	binding atomic.Int32  // bindLater goroutines running
}

type accepted struct {
	c   *mxLANConn
	err error
}

// Listen accepts streams on the transport's endpoint; addr is the
// gateway's LAN address the streams' open metadata must name.
func (t *MXTransport) Listen(addr netip.AddrPort) (LANListener, error) {
	if t.EP == nil {
		return nil, errors.New("mx LAN transport: no endpoint (open one on an engine bound to the LAN interface)")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.listening {
		return nil, fmt.Errorf("mx LAN transport: endpoint %v already has a listener", t.EP.Addr())
	}
	ln, err := mx.Listen(t.EP, t.streamConfig())
	if err != nil {
		return nil, err
	}
	t.listening = true
	ctx, cancel := context.WithCancel(context.Background())
	l := &mxListener{t: t, ln: ln, addr: addr, ctx: ctx, cancel: cancel, out: make(chan accepted)}
	go l.run()
	return l, nil
}

func (l *mxListener) Accept() (LANConn, error) {
	select {
	case a := <-l.out:
		if a.err != nil {
			return nil, a.err
		}
		return l.t.lanConn(a.c), nil
	case <-l.ctx.Done():
		return nil, fmt.Errorf("mx LAN listener %v: %w", l.addr, net.ErrClosed)
	}
}

// run takes the engine's streams until the listener closes and hands
// those whose claim holds to Accept: at once when Bind knows the
// address, else from bindLater, so a claim that takes a wait holds up no
// other stream.
func (l *mxListener) run() {
	for {
		s, err := l.ln.Accept(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			l.deliver(accepted{err: err})
			continue
		}
		from, to, err := header.ParseEndpointPair(s.Meta)
		if err != nil || to != l.addr {
			// A node that does not say who it is, or names another
			// gateway, gets a reset, as a TCP connection to a wrong
			// address would.
			s.Abort()
			continue
		}
		c := &mxLANConn{Stream: s, local: l.addr, remote: unmapAP(from)}
		switch err := l.t.bind(c, false); {
		case errors.Is(err, errUnresolved):
			l.bindLater(c)
		case err == nil:
			l.deliver(accepted{c: c})
		}
	}
}

// deliver waits for Accept to take a, or for the listener to close.
func (l *mxListener) deliver(a accepted) {
	select {
	case l.out <- a:
	case <-l.ctx.Done():
		if a.c != nil {
			a.c.Abort()
		}
	}
}

// bindLater checks c's claim on a goroutine of its own, which may take
// bindWait, and hands c to Accept if it holds. Past maxBinding claims at
// once, c is refused.
func (l *mxListener) bindLater(c *mxLANConn) {
	if l.binding.Add(1) > maxBinding {
		l.binding.Add(-1)
		l.t.refuse(c, "mx_identity", "too many streams at once claim addresses not resolved yet", "limit", maxBinding)
		return
	}
	go func() {
		defer l.binding.Add(-1)
		if l.t.bind(c, true) == nil {
			l.deliver(accepted{c: c})
		}
	}()
}

// bind checks the node address c claims with Bind, then records where
// the node's daemon is for Dial. A claim that fails is refused (c is
// reset), except for errUnresolved without wait, which is returned for
// the caller to wait.
func (t *MXTransport) bind(c *mxLANConn, wait bool) error {
	a, mac := c.remote.Addr(), c.Peer().MAC
	if t.Bind != nil {
		if err := t.Bind(a, mac, wait); err != nil && !t.learnedAs(a, c.Peer(), err) {
			if !wait && errors.Is(err, errUnresolved) {
				return err
			}
			t.refuse(c, "mx_identity", "the stream claims an address its host does not hold", "claimed", a.String(), "mac", mac.String(), "err", err)
			return err
		}
	}
	if _, had := t.learned.Swap(a, c.Peer()); !had && t.nLearned.Add(1) > maxLearned {
		t.learned.Delete(a)
		t.nLearned.Add(-1)
	}
	return nil
}

// learnedAs reports whether a, which Bind could not resolve (err), was
// bound to the endpoint from by an earlier stream: the kernel forgets idle
// neighbours, and a node that speaks MX only never refreshes its entry.
func (t *MXTransport) learnedAs(a netip.Addr, from mx.Addr, err error) bool {
	v, ok := t.learned.Load(a)
	return ok && v.(mx.Addr) == from && errors.Is(err, errUnresolved)
}

// refuse resets c, refused for reason.
func (t *MXTransport) refuse(c *mxLANConn, reason, msg string, args ...any) {
	if t.refused != nil {
		t.refused(reason, "MX stream refused: "+msg, append([]any{"remote", c.remote.String()}, args...)...)
	}
	c.Abort()
}

func (l *mxListener) Addr() netip.AddrPort { return l.addr }

func (l *mxListener) Close() error {
	l.cancel()
	l.t.mu.Lock()
	l.t.listening = false
	l.t.mu.Unlock()
	return nil
}

// Dial opens a stream to the node daemon serving dst. The local endpoint is
// local and a port the transport draws (MX has no ports): the destination
// sees it as the connection's source, and bound records it first.
func (t *MXTransport) Dial(ctx context.Context, local netip.Addr, dst netip.AddrPort, resume header.ResumeID, bound func(netip.AddrPort)) (LANConn, error) {
	if t.EP == nil {
		return nil, errors.New("mx LAN transport: Dial needs an endpoint")
	}
	var to mx.Addr
	var err error
	if v, ok := t.learned.Load(dst.Addr().Unmap()); ok {
		to = v.(mx.Addr)
	} else if t.Resolve == nil {
		return nil, fmt.Errorf("mx LAN transport: no MX endpoint for %v: its node daemon has not opened a stream", dst.Addr())
	} else if to, err = t.Resolve(dst.Addr()); err != nil {
		return nil, fmt.Errorf("mx LAN transport: no MX endpoint for %v: %w", dst.Addr(), err)
	}
	port := uint16(32768 + t.port.Add(1)%28232) // Linux's ephemeral range
	src := netip.AddrPortFrom(local, port)
	if bound != nil {
		bound(src)
	}
	meta, err := header.AppendStreamMeta(nil, src, dst, resume)
	if err != nil {
		return nil, err
	}
	s, err := mx.Dial(ctx, t.EP, to, meta, t.streamConfig())
	if err != nil {
		return nil, err
	}
	return t.lanConn(&mxLANConn{Stream: s, local: src, remote: dst}), nil
}

var _ LANConn = (*mxLANConn)(nil)
