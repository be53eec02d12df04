// Package tuning holds the WAN tuning policies of the mpi5k gateways, each
// applied to a socket or a relay.Link from outside the multiplexer:
//   - sockopt.go: socket options of LAN and WAN sockets (TCP_NODELAY,
//     congestion control, buffers, TCP_NOTSENT_LOWAT, pacing, the RTO floor
//     and delayed-ACK ceiling of Linux 6.15; bench/figures/wantimers), and
//     the checks that say, before a gateway starts, whether the kernel
//     offers and allows them.
//   - prime.go: PAD filler on each new BBR link until BBR has measured the
//     path (bench/figures/prime).
//   - guard.go: the PROBE_RTT guard, which holds a busy BBR bulk link across
//     its min_rtt expiry instead of letting it dip (bench/figures/bulk).
//   - warm.go: whether the links stay warm across pauses
//     (tcp_slow_start_after_idle, which the gateway reads but never writes;
//     bench/figures/warm).
//   - socket.go: reading a link's TCP_INFO and BBR state in one call.
//
// The mechanisms they steer belong to package relay (Link.Hold, Link.Pad,
// Link.WatchSend); the queue control that caps a bulk link's bytes while
// messages cross, and the express link's renewal, decide inside the link and
// stay there.
package tuning
