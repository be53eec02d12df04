package node

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tcpListen is the state of a listening socket in the kernel's socket
// dump (include/net/tcp_states.h).
const tcpListen = 10

// listenOwner checks that the user who holds rank, the rank's end of a
// control connection to the daemon's end daemon, also holds every socket
// that listens on port for node (bound to node's address or a wildcard),
// and that there is one: a user of the node may open to other sites only
// a port of their own (LISTEN), never another user's service. The
// kernel's socket dump (sock_diag, what ss reads) gives each socket's
// owner to any user.
func listenOwner(rank, daemon netip.AddrPort, node netip.Addr, port uint16) error {
	var socks []*netlink.Socket
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		var s []*netlink.Socket
		var err error
		for try := 0; try < 3; try++ { // a dump raced by socket changes is retried
			if s, err = netlink.SocketDiagTCP(fam); !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("listing the node's TCP sockets: %w", err)
		}
		socks = append(socks, s...)
	}
	addr := func(ip []byte, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	uid, found := uint32(0), false
	for _, s := range socks {
		if addr(s.ID.Source, s.ID.SourcePort) == rank && addr(s.ID.Destination, s.ID.DestinationPort) == daemon {
			uid, found = s.UID, true
			break
		}
	}
	if !found {
		return fmt.Errorf("no socket of this node is the rank's end %v of its connection to the daemon", rank)
	}
	owned := false
	for _, s := range socks {
		if s.State != tcpListen || s.ID.SourcePort != port {
			continue
		}
		if a := addr(s.ID.Source, port).Addr(); a != node && !a.IsUnspecified() {
			continue // bound to another address: not what the gateway reaches
		}
		if s.UID != uid {
			return fmt.Errorf("port %d listens for user %d, not for user %d who asks", port, s.UID, uid)
		}
		owned = true
	}
	if !owned {
		return fmt.Errorf("nothing listens on port %d for %v", port, node)
	}
	return nil
}
