package tuning

import (
	"bytes"
	"fmt"
	"os"
)

// Keeping the WAN links warm.
//
// The express link carries app-limited messages on a CUBIC socket (the
// default --wan-express-cc), and Linux cuts such a socket's congestion
// window in two ways, both gated by the network namespace's
// net.ipv4.tcp_slow_start_after_idle (1 by default) and by nothing per
// socket: after an idle period longer than one RTO the window is halved once
// per RTO idle, down to the initial 10 segments (tcp_cwnd_restart), and
// while the socket is app-limited it decays every RTO towards what was in
// flight (tcp_cwnd_application_limited). BBR, which runs the bulk links (and
// the express link with --wan-express-cc bbr), is exempt: the kernel skips
// both for a CC with its own cong_control. With the WAN RTO floor at 10 ms
// (--wan-rto-min) the RTO at 20 ms RTT is about 30 ms, so every pause of an
// MPI job between bursts restarted a CUBIC express link, and a 64 KiB
// message then took three round trips instead of one: 18 idle restarts in
// one BT run, BT 1.09x and SP 1.10x direct's time on the lab (Reno hosts, 20
// ms); with the sysctl off 0 restarts, 0.99x and 1.00x, side by side.
//
// The gateway process never writes the sysctl: a host-wide setting written
// by a process outlives it when the process is killed (SIGKILL at a job's
// walltime, SIGPIPE from a closed ssh), and changes every other user's TCP
// on the host. Small filler frames sent while the link is idle would stop
// the restart but not the decay, which halves the window per RTO towards
// what was last in flight just as fast, so there is no per-socket
// substitute. The sysctl is set by whoever owns the host: the
// mpi5k-gateway.service unit sets it to 0 before the gateway starts and
// restores the value it found after every stop, SIGKILL and crashes
// included (systemd runs ExecStopPost then), or an administrator sets it.
// A gateway asked to keep its links warm, with a WAN socket that is not BBR,
// checks it and says, with the fix, when the links will not stay warm.

// RestartsAfterIdle says whether some WAN socket runs a congestion control
// that Linux restarts after idle: anything but BBR ("" is the system's
// default, which may be CUBIC). wanCC is the bulk links' CC; expressCC the
// express link's ("" for the same as the bulk links), express whether there
// is one.
func RestartsAfterIdle(wanCC, expressCC string, express bool) bool {
	if expressCC == "" {
		expressCC = wanCC
	}
	return wanCC != "bbr" || (express && expressCC != "bbr")
}

// slowStartAfterIdle is a variable so tests can point it at a file.
var slowStartAfterIdle = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"

// KeepWarmFix is what an operator does so the express link stays warm.
const KeepWarmFix = "run the gateway as the mpi5k-gateway service (its unit sets net.ipv4.tcp_slow_start_after_idle=0 while the gateway runs and restores it on every stop) or set it on the gateway host yourself: sysctl -w net.ipv4.tcp_slow_start_after_idle=0"

// WarmState reads the namespace's tcp_slow_start_after_idle: warm is true
// when it is 0, state says what was found for the start-up log.
func WarmState() (warm bool, state string, err error) {
	b, err := os.ReadFile(slowStartAfterIdle)
	if err != nil {
		return false, "", fmt.Errorf("reading net.ipv4.tcp_slow_start_after_idle: %w", err)
	}
	v := string(bytes.TrimSpace(b))
	if v == "0" {
		return true, "tcp_slow_start_after_idle is 0", nil
	}
	return false, "cold: tcp_slow_start_after_idle is " + v, nil
}
