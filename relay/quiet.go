package relay

import (
	"errors"
	"net"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"golang.org/x/sys/unix"
)

// Quiet links (HELLO feature QUIET).
//
// Even pinging only every third of DeadAfter, each idle link wakes both
// gateways: the PING's write, the PONG's read, the threads and samplers
// behind them. On a hub with hundreds of idle peers those wake-ups are
// most of its idle CPU. A link with no streams that carries nothing but
// keepalives therefore goes quiet when the peer has the feature: this
// side sends no PING and no ACK of its own, does not count the peer's
// silence, and leaves the connection to the kernel's TCP keepalive,
// whose probes and their answers wake no process. A peer whose host or
// path died is still found after about DeadAfter: the probes go
// unanswered and TCP_USER_TIMEOUT ends the connection, which the reader
// sees as an error (a resuming link then resumes). A peer that is
// connected but silent (hung) is noticed only when traffic starts: the
// first frame other than a keepalive, or a stream opened on the trunk,
// wakes the link, which pings again and counts silence from then.
//
// A quiet link still answers PINGs (Alive, a peer without the feature
// or whose kernel refused the options), so either side may fall back
// to pinging on its own.

// watchByKernel turns on the kernel's keepalive on conn's socket, timed
// so that a dead host or path is found after about DeadAfter, as silence
// would be: the first probe after idlePing without a segment from the
// peer, then one every PingInterval (whole seconds, the options' unit),
// and TCP_USER_TIMEOUT (DeadAfter, unless the socket has one already)
// ends the connection when probes or data stay unanswered that long. An
// error leaves the link pinging as before.
func watchByKernel(conn net.Conn, cfg *Config) error {
	sc := sockOf(conn)
	if sc == nil {
		return errors.New("no TCP socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	idle, intvl := secs(idlePing(cfg)), secs(cfg.PingInterval)
	cnt := max(1, (secs(cfg.DeadAfter)-idle+intvl-1)/intvl)
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		s := int(fd)
		ut, err := unix.GetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		if err != nil {
			serr = err
			return
		}
		if ut == 0 {
			ut = int(cfg.DeadAfter.Milliseconds())
		}
		for _, o := range []struct{ level, opt, v int }{
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, idle},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, intvl},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, cnt},
			{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, ut},
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		} {
			if serr = unix.SetsockoptInt(s, o.level, o.opt, o.v); serr != nil {
				return
			}
		}
	})
	return errors.Join(cerr, serr)
}

// secs is d in whole seconds, rounded up, at least 1.
func secs(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// watchConn lets the kernel watch conn, the link's new connection, if the
// peer goes quiet too; kernelWatch tells the keeper whether it may.
func (l *Link) watchConn(conn net.Conn) {
	ok := false
	if l.peer.Features&header.FeatureQuiet != 0 {
		if err := watchByKernel(conn, &l.cfg); err != nil {
			l.log.Info("WAN link keeps pinging while idle: TCP keepalive not set", "peer", l.peer.Name,
				"link", l.index, "err", err)
		} else {
			ok = true
		}
	}
	l.kernelWatch.Store(ok)
}

// keepQuiet decides at a keepalive tick whether l is quiet until the
// next one: the kernel watches its connection, it carried nothing but
// keepalives since the last tick (busy false) and its trunk has no
// streams. Going quiet, a resuming link acknowledges what it received,
// so the peer does not keep those frames while the link is idle; waking
// up, silence counts from now, not from the peer's last frame.
func (l *Link) keepQuiet(now time.Time, busy bool) bool {
	q := !busy && l.kernelWatch.Load() && l.t.NumStreams() == 0
	switch {
	case q && !l.quiet && l.rs != nil:
		if n := l.rs.recvSeq.Load(); n != l.rs.ackSent.Load() {
			l.sendAck(n)
		}
	case !q && l.quiet:
		l.wokeAt = now.UnixNano()
	}
	l.quiet = q
	return q
}
