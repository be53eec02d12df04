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
//   - queue.go: queue control, which caps the bulk links' receive windows
//     while messages cross the express link, so they do not wait behind a
//     full bottleneck queue (bench/figures/queuecontrol). It plugs into
//     relay.Config.QueueControl; the relay samples the links and carries
//     the caps in CLAMP frames.
//   - express.go: express control, which renews the express link when
//     losses have left its window too cold for one message
//     (bench/figures/express), and holds it aside while another flow
//     keeps the WAN queue full (bench/figures/computework). It plugs into
//     relay.Config.ExpressControl; the gateway's WAN sampler feeds it
//     (relay.Trunk.StepExpress), and the relay renews and holds.
//
// The mechanisms they steer belong to package relay (Link.Hold, Link.Pad,
// Link.WatchSend, Trunk.HoldExpress, the renewal of the express link, the
// QueueController and ExpressController hooks). A new policy of either
// hook's kind is a file here, its line in the gateway's relayConfig
// (gateway/config.go) and its flag (gateway/flags.go).
package tuning
