// Package degraded names what a gateway runs without. The gateway's
// mpi5k_degraded{reason} carries a short code (a bounded label value);
// Text is its sentence, for people: in the gateway's log and /ready
// answer, and on one line of `mpi5k run`'s summary (package wrap), so a
// user who never reads the gateway's log still learns that, and why, the
// job ran with less than mpi5k can do. docs/operations.md lists them.
package degraded

// The reason codes.
const (
	RTOFloor    = "rto_floor"
	NoBBR       = "no_bbr"
	NoCubic     = "no_cubic"
	NotWarm     = "not_warm"
	WarmUnknown = "warm_unknown"
)

var texts = map[string]string{
	RTOFloor:    "WAN RTO floor 200ms, not 10ms: the kernel lacks TCP_RTO_MIN_US (Linux 6.15 or newer)",
	NoBBR:       "bulk WAN links on the default congestion control, not BBR: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)",
	NoCubic:     "express link not on CUBIC: not allowed without CAP_NET_ADMIN (net.ipv4.tcp_allowed_congestion_control)",
	NotWarm:     "express link not kept warm: net.ipv4.tcp_slow_start_after_idle is not 0 on the gateway host",
	WarmUnknown: "express link perhaps not kept warm: net.ipv4.tcp_slow_start_after_idle unreadable",
}

// Text is the sentence for a reason of mpi5k_degraded (the reason itself
// if this build does not know it).
func Text(reason string) string {
	if t, ok := texts[reason]; ok {
		return t
	}
	return reason
}
