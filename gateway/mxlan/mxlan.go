// Package mxlan is what the hosts of a site's MX LAN agree on
// (--lan-transport mx, docs/mx-wire-format.md): the endpoint id and the
// engine settings of the gateway (package gateway) and of every node
// daemon (package node).
package mxlan

import (
	"time"

	"github.com/mpi5k/mpi5k/mx"
)

// Endpoint is the endpoint id of the MX LAN transport on every host of a
// site: the gateway's and each node daemon's.
const Endpoint = 1

// PeerTimeout is how long a LAN peer (the gateway, a node daemon) may
// leave frames unacknowledged before its channel, and every stream on it,
// is failed: the bound of the WAN links (DeadAfter) and of a rank's
// connection to its gateway, not the engine's 1 s default, which a CPU
// starved for a second (the lab on a loaded machine) trips, resetting
// hundreds of live streams at once.
const PeerTimeout = 10 * time.Second

// KeepAlive is how long an idle MX channel waits before asking its peer
// to answer: a node daemon then learns within PeerTimeout that its
// gateway is gone (and the gateway that a node is) with no stream open.
const KeepAlive = time.Second

// Config is the engine configuration of a host of the site's MX LAN that
// admits the peers allow admits.
func Config(allow func(mx.MAC) bool) mx.Config {
	return mx.Config{Allow: allow, PeerTimeout: PeerTimeout, KeepAlive: KeepAlive}
}
