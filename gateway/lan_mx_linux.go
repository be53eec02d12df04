package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/mx/afpacket"
	"github.com/mpi5k/mpi5k/sitemap"
)

// MXEndpoint is the endpoint id of the MX LAN transport on every host of a
// site: the gateway's and each node daemon's.
const MXEndpoint = 1

// MXPeerTimeout is how long a LAN peer (the gateway, a node daemon) may
// leave frames unacknowledged before its channel, and every stream on it,
// is failed: the bound of the WAN links (DeadAfter) and of a rank's
// connection to its gateway, not the engine's 1 s default, which a CPU
// starved for a second (the lab on a loaded machine) trips, resetting
// hundreds of live streams at once.
const MXPeerTimeout = 10 * time.Second

// MXKeepAlive is how long an idle MX channel waits before asking its peer
// to answer: a node daemon then learns within MXPeerTimeout that its
// gateway is gone (and the gateway that a node is) with no stream open.
const MXKeepAlive = time.Second

// newMXLAN starts the MX engine of --lan-transport mx on cfg.LANIf. The
// engine lives as long as the process: streams drain past the LAN
// listener's close.
func newMXLAN(cfg *Config, site *sitemap.Site) (*MXTransport, error) {
	ifi, err := net.InterfaceByName(cfg.LANIf)
	if err != nil {
		return nil, fmt.Errorf("--lan-if %q: %w", cfg.LANIf, err)
	}
	link, err := afpacket.Open(cfg.LANIf)
	if err != nil {
		return nil, err
	}
	// A site's nodes are its nets and its explicit hosts: the map `mpi5k
	// run` writes lists only hosts.
	m := cfg.Map
	nb := &neighbors{ifindex: ifi.Index, inSite: func(a netip.Addr) bool {
		s, ok := m.Lookup(a)
		return ok && s.ID == site.ID
	}}
	e, err := mx.New(link, mx.Config{Allow: nb.allowed, PeerTimeout: MXPeerTimeout, KeepAlive: MXKeepAlive})
	if err != nil {
		link.Close()
		return nil, err
	}
	ep, err := e.Open(MXEndpoint)
	if err != nil {
		e.Close()
		return nil, err
	}
	return &MXTransport{EP: ep, Resolve: nb.resolve}, nil
}

// neighbors is the site's hosts as the kernel's neighbour (ARP/NDP) table
// on the LAN interface knows them: which MACs may send MX frames (those of
// addresses in the site's networks) and where a node's daemon is. It is
// re-read on a miss, at most once a second, so a flood of foreign frames
// costs one netlink dump a second.
type neighbors struct {
	ifindex int
	inSite  func(netip.Addr) bool

	mu     sync.Mutex
	macs   map[mx.MAC]bool
	byIP   map[netip.Addr]mx.MAC
	readAt time.Time
}

func (n *neighbors) refresh() {
	if time.Since(n.readAt) < time.Second {
		return
	}
	n.readAt = time.Now()
	list, err := netlink.NeighList(n.ifindex, netlink.FAMILY_ALL)
	if err != nil {
		return
	}
	n.macs, n.byIP = map[mx.MAC]bool{}, map[netip.Addr]mx.MAC{}
	for _, e := range list {
		a, ok := netip.AddrFromSlice(e.IP)
		if !ok || len(e.HardwareAddr) != 6 || e.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0 {
			continue
		}
		a = a.Unmap()
		if !n.inSite(a) {
			continue
		}
		var m mx.MAC
		copy(m[:], e.HardwareAddr)
		n.macs[m] = true
		n.byIP[a] = m
	}
}

func (n *neighbors) allowed(m mx.MAC) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.macs[m] {
		n.refresh()
	}
	return n.macs[m]
}

func (n *neighbors) resolve(a netip.Addr) (mx.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.byIP[a]
	if !ok {
		n.refresh()
		m, ok = n.byIP[a]
	}
	if !ok {
		return mx.Addr{}, fmt.Errorf("%v is not in the neighbour table of the LAN interface (the node has not spoken to this host)", a)
	}
	return mx.Addr{MAC: m, EP: MXEndpoint}, nil
}
