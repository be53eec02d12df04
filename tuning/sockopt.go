package tuning

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/relay"
)

// SockOpts are the per-side socket options. They are applied on the raw
// socket before connect (dial) or on the listener (inherited by accepted
// sockets), so buffer sizes shape the TCP window scale negotiated in the
// handshake.
type SockOpts struct {
	CC           string        // TCP_CONGESTION, "" keeps the system default
	SndBuf       int           // SO_SNDBUF, 0 keeps autotuning
	RcvBuf       int           // SO_RCVBUF, 0 keeps autotuning
	NotSentLowat int           // TCP_NOTSENT_LOWAT, 0 leaves it unset
	UserTimeout  time.Duration // TCP_USER_TIMEOUT, 0 leaves it unset
	// ThinLinear sets TCP_THIN_LINEAR_TIMEOUTS: while few segments are in
	// flight (an aggregated link carrying only small MPI messages), the
	// first retransmission timeouts do not back off exponentially, so one
	// lost retransmission costs an RTO, not a doubling chain that stalls
	// every stream of the link for seconds.
	ThinLinear bool
	// RTOMin sets TCP_RTO_MIN_US and DelackMax TCP_DELACK_MAX_US (0 leaves
	// the kernel's 200 ms floor and delayed-ACK ceiling). Linux's RTO is
	// srtt + max(4 x rttvar, RTO floor), and a lone lost segment (one MPI
	// message on a quiet link) waits for a tail-loss probe no sooner than
	// 1.5 x srtt + the delayed-ACK ceiling, or for that RTO: about 245 ms
	// at 20 ms RTT. Both ends of a WAN link are gateways, so the ACK delay
	// the floor guards against is ours to bound too.
	RTOMin, DelackMax time.Duration
	// MaxPacingRate sets SO_MAX_PACING_RATE (bytes/s, 0 leaves it unset):
	// the kernel spreads this socket's packets at no more than this rate
	// (TCP's own pacing; BBR and CUBIC both honour the cap).
	MaxPacingRate uint64
}

func (o SockOpts) apply(fd int) error {
	// TCP_NODELAY everywhere: the relay batches frames itself, and Nagle
	// would hold a small MPI message back by up to an RTT.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if o.CC != "" {
		if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, o.CC); err != nil {
			return fmt.Errorf("TCP_CONGESTION: %w", ccError(o.CC, err))
		}
	}
	if o.SndBuf > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, o.SndBuf); err != nil {
			return fmt.Errorf("SO_SNDBUF: %w", err)
		}
	}
	if o.RcvBuf > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, o.RcvBuf); err != nil {
			return fmt.Errorf("SO_RCVBUF: %w", err)
		}
	}
	if o.NotSentLowat > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, o.NotSentLowat); err != nil {
			return fmt.Errorf("TCP_NOTSENT_LOWAT: %w", err)
		}
	}
	if o.ThinLinear {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_THIN_LINEAR_TIMEOUTS, 1); err != nil {
			return fmt.Errorf("TCP_THIN_LINEAR_TIMEOUTS: %w", err)
		}
	}
	if o.MaxPacingRate > 0 {
		if err := unix.SetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, o.MaxPacingRate); err != nil {
			return fmt.Errorf("SO_MAX_PACING_RATE: %w", err)
		}
	}
	if o.RTOMin > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, TCPRTOMinUS, int(o.RTOMin.Microseconds())); err != nil {
			return fmt.Errorf("TCP_RTO_MIN_US: %w", err)
		}
	}
	if o.DelackMax > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, TCPDelackMaxUS, int(o.DelackMax.Microseconds())); err != nil {
			return fmt.Errorf("TCP_DELACK_MAX_US: %w", err)
		}
	}
	if o.UserTimeout > 0 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(o.UserTimeout.Milliseconds())); err != nil {
			return fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
		}
	}
	return nil
}

// Socket options of recent kernels (include/uapi/linux/tcp.h) that
// golang.org/x/sys/unix does not name yet: both came with Linux 6.15
// (Debian 12's 6.1 answers ENOPROTOOPT, and the gateway keeps the
// kernel's 200 ms floors there).
const (
	TCPRTOMinUS    = 45
	TCPDelackMaxUS = 46
)

// CheckTimers reports whether the kernel takes o's RTOMin and DelackMax:
// ENOPROTOOPT from a kernel older than these options.
func (o SockOpts) CheckTimers() error {
	if o.RTOMin <= 0 && o.DelackMax <= 0 {
		return nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return SockOpts{RTOMin: o.RTOMin, DelackMax: o.DelackMax}.apply(fd)
}

// Control returns a net.Dialer/ListenConfig Control function applying o.
func (o SockOpts) Control(extra func(fd int) error) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var err error
		cerr := c.Control(func(fd uintptr) {
			if err = o.apply(int(fd)); err == nil && extra != nil {
				err = extra(int(fd))
			}
		})
		if cerr != nil {
			return cerr
		}
		return err
	}
}

// ApplyConn sets o on an existing connection (accepted LAN sockets, whose
// listener cannot carry every option).
func (o SockOpts) ApplyConn(c *net.TCPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return o.Control(nil)("tcp", "", rc)
}

// CheckCC reports whether this process may run congestion control cc on a
// socket, by setting it on one: the kernel must offer it
// (tcp_available_congestion_control) and, for a process without
// CAP_NET_ADMIN, allow it (tcp_allowed_congestion_control). The error names
// the sysctl that stops it and the fix.
func CheckCC(cc string) error {
	if cc == "" {
		return nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("congestion control %q: probe socket: %w", cc, err)
	}
	defer unix.Close(fd)
	return ccError(cc, unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc))
}

// ccError explains a failed TCP_CONGESTION: not offered by the kernel
// (ENOENT), or offered but not allowed without CAP_NET_ADMIN (EPERM).
func ccError(cc string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM):
		allowed := readCCList("tcp_allowed_congestion_control")
		return fmt.Errorf("congestion control %q: %w: net.ipv4.tcp_allowed_congestion_control is %q and this process lacks CAP_NET_ADMIN; "+
			"fix: allow it on this host (sysctl -w net.ipv4.tcp_allowed_congestion_control=%q), run with CAP_NET_ADMIN (the mpi5k-gateway service unit grants it), or pick an allowed one",
			cc, err, allowed, strings.TrimSpace(allowed+" "+cc))
	case errors.Is(err, unix.ENOENT):
		return errnoError{fmt.Sprintf("congestion control %q: not offered by this kernel (net.ipv4.tcp_available_congestion_control is %q); fix: modprobe tcp_%s, or pick an available one",
			cc, availableCC(), cc), err}
	}
	return fmt.Errorf("congestion control %q: %w (available: %s)", cc, err, availableCC())
}

// errnoError is an explanation that stands in for the errno it keeps, so
// callers (the gateway's fallbacks, mpi5k doctor) still tell the cases
// apart with errors.Is.
type errnoError struct {
	msg   string
	errno error
}

func (e errnoError) Error() string { return e.msg }
func (e errnoError) Unwrap() error { return e.errno }

// linuxCCs are the congestion controls Linux ships as modules.
var linuxCCs = []string{"bbr", "bic", "cdg", "cubic", "dctcp", "highspeed", "htcp", "hybla", "illinois",
	"lp", "nv", "reno", "scalable", "vegas", "veno", "westwood", "yeah"}

// CheckCCName is the check of a congestion control a remote gateway will
// set (`mpi5k run`): the kernel there decides, so this one only refuses a
// name neither Linux ships nor this kernel offers.
func CheckCCName(cc string) error {
	if cc == "" || slices.Contains(linuxCCs, cc) || slices.Contains(strings.Fields(availableCC()), cc) {
		return nil
	}
	return fmt.Errorf("no congestion control is called %q (Linux has %s)", cc, strings.Join(linuxCCs, ", "))
}

// procSysIPv4 is a variable so tests can point it at a directory of fake
// sysctls.
var procSysIPv4 = "/proc/sys/net/ipv4"

func readCCList(name string) string {
	b, err := os.ReadFile(procSysIPv4 + "/" + name)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func availableCC() string { return readCCList("tcp_available_congestion_control") }

// TCPInfo reads the kernel's TCP_INFO of c, or of the TCP connection an
// encrypting wrapper runs over. (A tcpinfo package will take this over;
// until then the gateway reads it directly.)
func TCPInfo(c net.Conn) (*unix.TCPInfo, error) {
	tc := relay.TCPOf(c)
	if tc == nil {
		return nil, fmt.Errorf("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return nil, err
	}
	return info, ierr
}

// TuneLink adjusts a WAN socket after the handshake, once its role is
// known: unpace lifts the pacing cap the dialer's or listener's options set
// on every WAN socket (the express link's small frames must not wait for a
// pacing slot); cc, if set, switches its congestion control.
func TuneLink(c *net.TCPConn, unpace bool, cc string) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if unpace {
			if err := unix.SetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, ^uint64(0)); err != nil {
				serr = fmt.Errorf("SO_MAX_PACING_RATE: %w", err)
				return
			}
		}
		if cc != "" {
			if err := unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc); err != nil {
				serr = fmt.Errorf("TCP_CONGESTION: %w", ccError(cc, err))
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// CheckTimers reports whether this kernel takes TCP_RTO_MIN_US and
// TCP_DELACK_MAX_US at the mpi5k-gateway defaults (10 ms, 5 ms):
// ENOPROTOOPT before Linux 6.15.
func CheckTimers() error {
	return SockOpts{RTOMin: 10 * time.Millisecond, DelackMax: 5 * time.Millisecond}.CheckTimers()
}
