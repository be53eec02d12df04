package gateway

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// LimitsConfig bounds what hostile or broken peers and nodes can take of
// a gateway (docs/limits.md): advanced settings, zero takes the default
// (fillLimits). Refusals are logged at most once per reason every 10 s and
// counted in mpi5k_refusals_total{reason}.
type LimitsConfig struct {
	// MaxLANConns: LAN connections at once (streams out, PEER_QUERY,
	// pending); default half the open-file limit, at most 65536 (at
	// least 64). Past it a new connection is reset at accept.
	MaxLANConns int
	// MaxPendingLAN: LAN connections that have not sent their first frame
	// yet (default 1024, at most MaxLANConns); past it, reset at accept.
	MaxPendingLAN int
	// MaxSourceStreams: streams one LAN host may have open at once
	// (default MaxLANConns/4); past it its OPEN is reset.
	MaxSourceStreams int
	// MaxSourcePending: LAN connections of one host that have not sent
	// their first frame yet (default MaxPendingLAN: no cap of its own);
	// past it, reset at accept. Whatever it is, when MaxPendingLAN or
	// MaxLANConns is full a new connection takes the place of the oldest
	// pending one of the host holding the most (lan_pending_evicted), if
	// that host holds more than the newcomer's: one host's silent
	// connections cannot keep another's ranks out, and one host may
	// still have hundreds of connects pending in a job's wire-up.
	MaxSourcePending int
	// MaxSourceControl: control connections (PEER_QUERY, LISTEN) one LAN
	// host may have open at once (default MaxLANConns/8, at most 1024,
	// at least 16: above the one each rank process of a large node
	// keeps); past it the connection is reset after its first frame.
	// With MaxSourceStreams it keeps one host below half of
	// MaxLANConns.
	MaxSourceControl int
	// ControlIdle: how long a control connection that holds no LISTEN
	// registration may send nothing before it is closed (default 2 min).
	// A rank's shim keeps its control connection for the process's
	// life, holding its LISTEN ports, and never idles one out; one with
	// no port is only for PEER_QUERY, which the shim sends again on a
	// fresh connection when the gateway has closed it.
	ControlIdle time.Duration
	// MaxPeerStreams: streams a peer site may have open into this site at
	// once (default MaxLANConns's default shared by the peers, at least
	// 64); past it the OPEN is refused (code 10, limit).
	MaxPeerStreams int
	// MaxPendingWAN: WAN connections in their handshake (TLS and HELLO)
	// from sources that are no map gateway's address: strangers and the
	// gateways of sites behind NAT (default 16, or twice the links of all
	// peers if more). Past half of it a new one is dropped at random,
	// more often as it fills; full, every new one is reset at accept.
	// Each map gateway's address has a pool of its own besides (twice its
	// links, at least 4), which no other source can take (admit.go).
	MaxPendingWAN int
	// MaxSourcePendingWAN: such connections one source address may have
	// in their handshake at once (default twice the links of a site pair,
	// at least 4); past it, reset at accept.
	MaxSourcePendingWAN int
	// MaxEarly: DATA bytes per peer site buffered for streams whose
	// destination is not connected yet (default 64 MiB); the stream that
	// would pass it is reset (code 10). Each stream's own is bounded by
	// Window: a peer that sends more breaks the protocol and its link fails.
	MaxEarly int64
	// MaxControl: control frames (PONG, WINDOW, OPEN_REFUSED, ...) queued
	// unsent on a WAN link (default 65536, at most 11 MiB); past it the peer does not read
	// what it asks for and the link fails.
	MaxControl int
}

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
