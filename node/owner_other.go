//go:build !linux

package node

import (
	"errors"
	"net/netip"
)

// listenOwner cannot tell who holds a port here: every LISTEN is refused.
func listenOwner(rank, daemon netip.AddrPort, node netip.Addr, port uint16) error {
	return errors.New("the node daemon cannot check who holds a port on this system")
}
