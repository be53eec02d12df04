package gateway

import (
	"bytes"
	"fmt"
	"os"
	"sync"
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
// So a gateway with Config.KeepWarm and a WAN socket that is not BBR turns
// the sysctl off in its network namespace while it runs and puts it back
// when the last such gateway of the process stops. It is a namespace-wide
// switch: other TCP connections of the gateway host stop restarting after
// idle too (what a dedicated gateway node wants anyway). A gateway killed
// with SIGKILL leaves it off; two gateway processes sharing one namespace
// restore it when the first of them stops.

// restartsAfterIdle says whether some WAN socket of c runs a congestion
// control that Linux restarts after idle: anything but BBR ("" is the
// system's default, which may be CUBIC).
func (c *Config) restartsAfterIdle() bool {
	x := c.ExpressCC
	if x == "" {
		x = c.WAN.CC // wanCreate
	}
	return c.WAN.CC != "bbr" || (c.Express && x != "bbr")
}

// slowStartAfterIdle is a variable so tests can point it at a file.
var slowStartAfterIdle = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"

var warm struct {
	mu      sync.Mutex
	users   int
	restore bool // we turned the sysctl off and put it back at the end
}

// keepWarm turns slow start after idle off for this process's network
// namespace and says what it did; release undoes it once every caller has
// released. An error (no permission, no such sysctl) names the sysctl and
// leaves nothing to release.
func keepWarm() (state string, release func(), err error) {
	warm.mu.Lock()
	defer warm.mu.Unlock()
	if warm.users == 0 {
		b, err := os.ReadFile(slowStartAfterIdle)
		if err != nil {
			return "", nil, fmt.Errorf("reading net.ipv4.tcp_slow_start_after_idle: %w", err)
		}
		warm.restore = false
		if v := string(bytes.TrimSpace(b)); v != "0" {
			if err := os.WriteFile(slowStartAfterIdle, []byte("0\n"), 0); err != nil {
				return "", nil, fmt.Errorf("setting net.ipv4.tcp_slow_start_after_idle=0 (was %s): %w", v, err)
			}
			warm.restore = true
		}
	}
	warm.users++
	state = "tcp_slow_start_after_idle already 0"
	if warm.restore {
		state = "tcp_slow_start_after_idle set to 0 while the gateway runs"
	}
	var once sync.Once
	return state, func() { once.Do(releaseWarm) }, nil
}

func releaseWarm() {
	warm.mu.Lock()
	defer warm.mu.Unlock()
	warm.users--
	if warm.users > 0 || !warm.restore {
		return
	}
	warm.restore = false
	// Put 1 back only over our own 0: someone who changed it since wins.
	if b, err := os.ReadFile(slowStartAfterIdle); err == nil && string(bytes.TrimSpace(b)) == "0" {
		os.WriteFile(slowStartAfterIdle, []byte("1\n"), 0)
	}
}
