package gateway

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// fillLimits sets the defaults of the limits (Config.Max*; docs/limits.md)
// for a gateway with npeers peer sites. With kernel TCP on the LAN the
// defaults follow the open-file limit: each LAN connection and each stream
// into this site holds one descriptor, and a gateway that runs out of them
// fails every accept and connect, the well-behaved ones too. An MX LAN's
// streams hold none, and an idle one costs the gateway about 2.3 KB
// (bench/figures/scale): they are bounded at 256 Ki, about 600 MB idle.
func (c *Config) fillLimits(npeers int) {
	files := 1 << 16 // if the limit cannot be read
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < 1<<30 {
		files = int(rl.Cur)
	}
	// Half the descriptors for each side, and at most 64 Ki.
	budget := max(min(files/2, 1<<16), 64)
	if _, mx := c.Transport.(*MXTransport); mx || c.Transport == nil && c.LANTransport == "mx" {
		budget = maxMXStreams
	}
	if c.MaxLANConns == 0 {
		c.MaxLANConns = budget
	}
	if c.MaxPendingLAN == 0 {
		c.MaxPendingLAN = min(1024, c.MaxLANConns)
	}
	if c.MaxSourceStreams == 0 {
		c.MaxSourceStreams = max(c.MaxLANConns/4, 16)
	}
	if c.MaxSourcePending == 0 {
		// No cap of its own: a full MaxPendingLAN makes room by dropping
		// the oldest of the largest holder's (pendingTable).
		c.MaxSourcePending = c.MaxPendingLAN
	}
	if c.MaxSourceControl == 0 {
		// One per rank process of a node (each has one to each gateway
		// host it uses), with room: about 30 KB each (docs/limits.md).
		c.MaxSourceControl = max(min(c.MaxLANConns/8, maxSourceControl), 16)
	}
	if c.ControlIdle == 0 {
		c.ControlIdle = 2 * time.Minute
	}
	if c.MaxPeerStreams == 0 {
		c.MaxPeerStreams = max(budget/max(npeers, 1), 64)
	}
	if c.MaxPendingWAN == 0 {
		links := c.WANConns + 1
		c.MaxPendingWAN = max(16, 2*links*npeers)
	}
	if c.MaxSourcePendingWAN == 0 {
		c.MaxSourcePendingWAN = max(4, 2*(c.WANConns+1))
	}
	if c.MaxEarly == 0 {
		c.MaxEarly = 64 << 20
	}
	if c.MaxControl == 0 {
		c.MaxControl = 1 << 16
	}
}

// maxMXStreams is the default bound of streams on an MX LAN.
const maxMXStreams = 1 << 18

// maxSourceControl is the largest default MaxSourceControl.
const maxSourceControl = 1024

// checkLimits refuses a negative limit (Validate).
func (c *Config) checkLimits() error {
	for _, v := range []struct {
		name string
		n    int64
	}{{"MaxLANConns", int64(c.MaxLANConns)}, {"MaxPendingLAN", int64(c.MaxPendingLAN)}, {"MaxSourceStreams", int64(c.MaxSourceStreams)},
		{"MaxSourcePending", int64(c.MaxSourcePending)}, {"MaxSourceControl", int64(c.MaxSourceControl)}, {"ControlIdle", int64(c.ControlIdle)},
		{"MaxPeerStreams", int64(c.MaxPeerStreams)}, {"MaxPendingWAN", int64(c.MaxPendingWAN)},
		{"MaxSourcePendingWAN", int64(c.MaxSourcePendingWAN)}, {"MaxEarly", c.MaxEarly}, {"MaxControl", int64(c.MaxControl)}} {
		if v.n < 0 {
			return fmt.Errorf("limit %s is %d: it must be positive (0 takes the default, docs/limits.md)", v.name, v.n)
		}
	}
	return nil
}

// takeSlot counts one more user of a limit of max, unless it is full.
func takeSlot(n *atomic.Int64, max int) bool {
	if n.Add(1) > int64(max) {
		n.Add(-1)
		return false
	}
	return true
}
