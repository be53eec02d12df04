package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/spread"
)

// Results of relayConnect, mirrored from shim.h.
const (
	resPass      = 1
	resRelayed   = 0
	resRelayedNB = 2
)

var warnOnce sync.Once

// relayConnect decides whether dst is in another site and, if so, connects
// the application's own fd to the local gateway and sends OPEN. The
// syscalls go straight to the kernel (x/sys/unix), not through the shim.
func relayConnect(fd int, dst netip.AddrPort) int {
	c := getConfig()
	if c == nil || !dst.IsValid() {
		return resPass
	}
	a := dst.Addr().Unmap()
	s, ok := c.m.Lookup(a)
	if !ok || s == c.local {
		return resPass // unknown to the map or same site: never touched
	}
	if _, gw := c.m.GatewaySite(a); gw {
		return resPass // talking to a gateway itself (e.g. its metrics)
	}
	dst = netip.AddrPortFrom(a, dst.Port())
	gw, err := openVia(fd, dst, c)
	if err == nil {
		watchGateway(fd)
		logf(levelDebug, "fd %d: %s (site %s) via gateway %s", fd, dst, s.Name, gw)
		if nonblocking(fd) {
			return resRelayedNB
		}
		return resRelayed
	}
	disconnect(fd)
	if c.fallback {
		logf(levelInfo, "gateway %s unreachable (%v): connecting %s directly (MPI5K_FALLBACK=direct)", gw, err, dst)
		return resPass
	}
	errno := errnoOf(err)
	warnOnce.Do(func() {
		logf(levelError, "cannot reach gateway %s of site %s (map %s) for %s: %v; set MPI5K_FALLBACK=direct to connect directly",
			gw, c.local.Name, c.mapPath, dst, err)
	})
	return -int(errno)
}

// gwOrder spreads the process's relayed connections over its site's
// gateway hosts (package spread: round robin from a random start per
// process, a gateway whose connect failed last for a while). Load beyond
// this is the source gateway's business: it sends each stream over the
// least loaded link to the destination site's gateways (gateway.pickLink).
var gwOrder spread.Order

// openVia connects fd to one of the site's gateways and sends OPEN for
// dst, trying the next gateway when one fails, all within c.timeout: each
// attempt gets an equal share of what is left, so a gateway host that
// does not answer leaves time for the others. It returns the gateway
// that took the connection, or the last one tried and its error.
func openVia(fd int, dst netip.AddrPort, c *config) (netip.AddrPort, error) {
	gws := c.gws
	order := gwOrder.Next(len(gws))
	deadline := time.Now().Add(c.timeout)
	var gw netip.AddrPort
	var err error
	for k, i := range order {
		if k > 0 {
			disconnect(fd)
		}
		gw = gws[i]
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		err = dialGateway(fd, gw, left/time.Duration(len(order)-k))
		if err == nil {
			var local unix.Sockaddr
			local, err = unix.Getsockname(fd)
			if err == nil {
				err = sendOpen(fd, dst, sockaddrToAddrPort(local), c)
			}
		}
		if err == nil {
			gwOrder.Succeeded(i)
			return gw, nil
		}
		if len(gws) > 1 {
			gwOrder.Failed(i)
			logf(levelInfo, "gateway %s of site %s: %v; trying the next one", gw, c.local.Name, err)
		}
	}
	return gw, err
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		switch e {
		case unix.ECONNREFUSED, unix.ENETUNREACH, unix.EHOSTUNREACH, unix.ETIMEDOUT,
			unix.ECONNRESET, unix.EADDRNOTAVAIL, unix.EAFNOSUPPORT, unix.EISCONN, unix.EALREADY:
			return e
		}
	}
	return unix.ECONNREFUSED
}

func nonblocking(fd int) bool {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	return err == nil && fl&unix.O_NONBLOCK != 0
}

// dialGateway connects fd to gw within timeout whatever the socket's mode:
// a blocking socket is switched to non-blocking for the connect so an
// unreachable gateway costs at most the timeout, then restored. A prior
// bind() of the application stays in effect (same fd).
func dialGateway(fd int, gw netip.AddrPort, timeout time.Duration) error {
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return err
	}
	var sa unix.Sockaddr
	switch {
	case dom == unix.AF_INET6:
		sa = &unix.SockaddrInet6{Port: int(gw.Port()), Addr: gw.Addr().As16()} // v4 becomes v4-mapped
	case dom == unix.AF_INET && gw.Addr().Unmap().Is4():
		sa = &unix.SockaddrInet4{Port: int(gw.Port()), Addr: gw.Addr().Unmap().As4()}
	default:
		return fmt.Errorf("an IPv4 socket cannot reach IPv6 gateway %s: %w", gw, unix.EAFNOSUPPORT)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if fl&unix.O_NONBLOCK == 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl|unix.O_NONBLOCK); err != nil {
			return err
		}
		defer unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl)
	}
	err = unix.Connect(fd, sa)
	if err == nil {
		return nil
	}
	if err != unix.EINPROGRESS && err != unix.EINTR {
		return err
	}
	if err := waitFd(fd, unix.POLLOUT, time.Now().Add(timeout)); err != nil {
		return err
	}
	soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if soerr != 0 {
		return syscall.Errno(soerr)
	}
	return nil
}

// waitFd polls fd for ev until deadline; ETIMEDOUT when it passes.
func waitFd(fd int, ev int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		ms := int(left / time.Millisecond)
		if ms == 0 {
			ms = 1
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: ev}}
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

// sendOpen writes the OPEN frame; the socket buffer of a fresh connection
// takes it at once, but a non-blocking socket may still say EAGAIN.
func sendOpen(fd int, dst, src netip.AddrPort, c *config) error {
	body, err := header.AppendOpen(nil, &header.Open{Dst: dst, Src: src, Label: c.label})
	if err != nil {
		return err
	}
	return sendAll(fd, header.AppendFrame(nil, header.TypeOpen, 0, body), time.Now().Add(c.timeout))
}

// sendAll writes frame to a socket that may be non-blocking, without SIGPIPE.
func sendAll(fd int, frame []byte, deadline time.Time) error {
	for len(frame) > 0 {
		n, err := unix.SendmsgN(fd, frame, nil, nil, unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := waitFd(fd, unix.POLLOUT, deadline); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		}
		frame = frame[n:]
	}
	return nil
}

// disconnect dissolves a half-made gateway connection (connect with
// AF_UNSPEC) so the socket can be connected again or closed cleanly.
func disconnect(fd int) {
	var sa unix.RawSockaddr
	sa.Family = unix.AF_UNSPEC
	unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
}

func sockaddrToAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch s := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), uint16(s.Port))
	}
	return netip.AddrPort{}
}

// ---- peer queries -----------------------------------------------------------

// peerClient is one control connection to a local gateway, shared by all
// threads of the process (UCX accepts on its own thread). Queries are
// serialised: an accept costs one LAN round trip either way. The socket is a
// raw fd with blocking-by-poll I/O rather than a net.Conn so that no netpoll
// epoll fd appears in the host process; it lives at a high fd number and is
// re-identified (inode) before each use, because hosts close fds they do not
// know about (orted, hydra) and may reuse the number.
type peerClient struct {
	mu   sync.Mutex
	addr netip.AddrPort
	fd   int
	ino  uint64
	dev  uint64
	rd   *header.Reader
	src  *fdReader
	// ports: this process's listening ports the connection registered
	// (LISTEN, listen.go); a new connection registers them again.
	ports []uint16
}

var (
	peerMu      sync.Mutex
	peerClients = map[netip.AddrPort]*peerClient{}
	peerReq     atomic.Uint32
)

// peerQuery asks the gateway at seen's address who the true source of the
// connection fd is.
func peerQuery(fd int, seen netip.AddrPort) (netip.AddrPort, uint8, bool) {
	c := getConfig()
	if c == nil {
		return netip.AddrPort{}, 0, false
	}
	// The gateway that dialed this connection holds its record: the one
	// whose address the connection comes from (gateways dial destinations
	// from their LAN address). Gateways that share an address (one host)
	// are asked in turn.
	var gws []netip.AddrPort
	if c.node.IsValid() {
		if seen.Addr().Unmap() != c.node.Addr() {
			return netip.AddrPort{}, 0, false
		}
		gws = []netip.AddrPort{c.node}
	} else if s, ok := c.m.GatewaySite(seen.Addr()); ok {
		for _, g := range s.Gateways {
			if g.LAN.Addr() == seen.Addr().Unmap() || g.WAN.Addr() == seen.Addr().Unmap() {
				gws = append(gws, g.LAN)
			}
		}
		if len(gws) == 0 {
			gws = []netip.AddrPort{s.LAN} // an address another site's gateway shares (GatewaySite)
		}
	}
	if len(gws) == 0 {
		return netip.AddrPort{}, 0, false
	}
	watchGateway(fd) // accepted from a gateway: a relayed connection too
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, 0, false
	}
	q := header.PeerQuery{Seen: seen, Local: sockaddrToAddrPort(sa)}
	for _, gw := range gws {
		pc := controlClient(gw)
		// One retry on a fresh connection: the gateway may have restarted or
		// closed an idle control connection.
		for attempt := 0; attempt < 2; attempt++ {
			r, err := pc.query(&q, c.timeout)
			if err == nil {
				if r.Found {
					return r.Source, r.SiteID, true
				}
				logf(levelInfo, "gateway %s does not know connection %s -> %s", gw, seen, q.Local)
				break
			}
			logf(levelWarn, "peer query to gateway %s: %v", gw, err)
		}
	}
	return netip.AddrPort{}, 0, false
}

// controlClient is the process's control connection to the gateway at
// addr.
func controlClient(addr netip.AddrPort) *peerClient {
	peerMu.Lock()
	defer peerMu.Unlock()
	pc := peerClients[addr]
	if pc == nil {
		pc = &peerClient{addr: addr, fd: -1}
		peerClients[addr] = pc
	}
	return pc
}

// highFd moves fd above the numbers applications usually use.
func highFd(fd int) int {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 900)
	if err != nil {
		return fd
	}
	unix.Close(fd)
	return nfd
}

func fdIdentity(fd int) (ino, dev uint64, ok bool) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0, 0, false
	}
	return st.Ino, st.Dev, true
}

func (pc *peerClient) dial(timeout time.Duration) error {
	dom := unix.AF_INET
	if !pc.addr.Addr().Unmap().Is4() {
		dom = unix.AF_INET6
	}
	fd, err := unix.Socket(dom, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return err
	}
	fd = highFd(fd)
	if err := dialGateway(fd, pc.addr, timeout); err != nil {
		unix.Close(fd)
		return err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	pc.ino, pc.dev, _ = fdIdentity(fd)
	pc.fd = fd
	pc.src = &fdReader{fd: fd}
	pc.rd = header.NewReader(pc.src, 256)
	return nil
}

type fdReader struct {
	fd       int
	deadline time.Time
}

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := waitFd(r.fd, unix.POLLIN, r.deadline); err != nil {
				return 0, err
			}
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (pc *peerClient) query(q *header.PeerQuery, timeout time.Duration) (header.PeerReply, error) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if err := pc.ensure(timeout); err != nil {
		return header.PeerReply{}, err
	}
	p, err := pc.exchange(header.TypePeerQuery, header.AppendPeerQuery(nil, q), header.TypePeerReply, timeout)
	if err != nil {
		return header.PeerReply{}, err
	}
	r, err := header.ParsePeerReply(p)
	if err != nil {
		return header.PeerReply{}, pc.fail(err)
	}
	return r, nil
}

// ensure connects pc if it has no connection, and registers the
// process's listening ports on a new one (caller holds pc.mu).
func (pc *peerClient) ensure(timeout time.Duration) error {
	if pc.fd >= 0 {
		if ino, dev, ok := fdIdentity(pc.fd); !ok || ino != pc.ino || dev != pc.dev {
			pc.fd = -1 // closed (and maybe reused) by the host: not ours to close
		}
	}
	if pc.fd >= 0 {
		return nil
	}
	if err := pc.dial(timeout); err != nil {
		return err
	}
	for _, port := range pc.ports {
		if _, err := pc.exchange(header.TypeListen, header.AppendListen(nil, port), header.TypeListenReply, timeout); err != nil {
			return fmt.Errorf("registering port %d again: %w", port, err)
		}
	}
	return nil
}

// fail drops pc's connection after err (caller holds pc.mu).
func (pc *peerClient) fail(err error) error {
	unix.Close(pc.fd)
	pc.fd, pc.rd = -1, nil
	return err
}

// exchange sends a request of type typ and returns the body of its reply
// of type want, matched by request id (caller holds pc.mu, connected).
func (pc *peerClient) exchange(typ header.Type, body []byte, want header.Type, timeout time.Duration) ([]byte, error) {
	id := peerReq.Add(1)
	if id == 0 {
		id = peerReq.Add(1)
	}
	deadline := time.Now().Add(timeout)
	pc.src.deadline = deadline
	if err := sendAll(pc.fd, header.AppendFrame(nil, typ, id, body), deadline); err != nil {
		return nil, pc.fail(err)
	}
	var buf [64]byte
	for {
		h, p, err := pc.rd.ReadFrame(buf[:])
		if err != nil {
			return nil, pc.fail(err)
		}
		if h.Type != header.TypePeerReply && h.Type != header.TypeListenReply {
			return nil, pc.fail(fmt.Errorf("gateway sent %v on a control connection", h.Type))
		}
		if h.Stream != id {
			continue // a late reply to an abandoned request
		}
		if h.Type != want {
			return nil, pc.fail(fmt.Errorf("gateway answered %v with %v", typ, h.Type))
		}
		return p, nil
	}
}

// Liveness of a rank's connection to its gateway. A gateway process that
// dies resets its connections at once; a gateway host that dies, or a LAN
// that drops, would leave a rank blocked in read() forever, or retrying
// writes for the kernel's ~15 minutes. The kernel therefore probes an idle
// connection after keepIdle and every keepIntvl, and gives up on one
// whose probes or data stay unacknowledged for userTimeout: ETIMEDOUT
// about 10 s after the gateway host went silent, the bound the gateways
// use for their WAN links (DeadAfter) and `mpi5k run` for a gateway
// outage. A live gateway host's kernel acknowledges probes and data
// however busy its process is, and a zero window that the gateway keeps
// acknowledging does not count, so a slow job is never cut.
const (
	keepIdle    = 5 // s
	keepIntvl   = 1 // s
	keepCnt     = 5
	userTimeout = 10 * time.Second
)

// watchGateway turns on keepalive and TCP_USER_TIMEOUT on fd, a rank's
// connection to or from a gateway, unless the application chose its own
// (it set SO_KEEPALIVE or a user timeout before connecting).
func watchGateway(fd int) {
	if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE); err != nil || on != 0 {
		return
	}
	if ut, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT); err != nil || ut != 0 {
		return
	}
	for _, o := range []struct{ level, opt, v int }{
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepIdle},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepIntvl},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepCnt},
		{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout / time.Millisecond)},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			logf(levelWarn, "fd %d: liveness option %d/%d of the gateway connection not set: %v", fd, o.level, o.opt, err)
			return
		}
	}
}
