package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/mx/afpacket"
	"github.com/mpi5k/mpi5k/sitemap"
)

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
	nb := &neighbors{site: site.ID, list: func() ([]netlink.Neigh, error) {
		return netlink.NeighList(ifi.Index, netlink.FAMILY_ALL)
	}}
	nb.smap.Store(cfg.Map)
	e, err := mx.New(link, mxlan.Config(nb.allowed))
	if err != nil {
		link.Close()
		return nil, err
	}
	ep, err := e.Open(mxlan.Endpoint)
	if err != nil {
		e.Close()
		return nil, err
	}
	return &MXTransport{EP: ep, Resolve: nb.resolve, Bind: nb.bind, mapChanged: nb.setMap}, nil
}

// neighbors is the site's hosts as the kernel's neighbour (ARP/NDP) table
// on the LAN interface knows them: which MACs may send MX frames (those of
// addresses in the site's networks) and where a node's daemon is. It is
// re-read on a miss, at most once a second, so a flood of foreign frames
// costs one netlink dump a second.
//
// A site's nodes are its nets and its explicit hosts (the map `mpi5k run`
// writes lists only hosts), in the map in force: a reload (setMap) re-reads
// the table at once, so a host the new map takes out of the site stops
// being admitted and one it adds is admitted without waiting for a miss.
type neighbors struct {
	site uint8
	smap atomic.Pointer[sitemap.Map]
	list func() ([]netlink.Neigh, error) // the LAN interface's table

	mu     sync.Mutex
	macs   map[mx.MAC]bool
	byIP   map[netip.Addr]mx.MAC
	readAt time.Time
}

// setMap puts a reloaded site map in force for admission.
func (n *neighbors) setMap(m *sitemap.Map) {
	n.smap.Store(m)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.readAt = time.Time{}
	n.refresh()
}

func (n *neighbors) inSite(a netip.Addr) bool {
	s, ok := n.smap.Load().Lookup(a)
	return ok && s.ID == n.site
}

func (n *neighbors) refresh() { n.refreshAfter(time.Second) }

// refreshAfter re-reads the table if it was last read at least d ago.
func (n *neighbors) refreshAfter(d time.Duration) {
	if time.Since(n.readAt) < d {
		return
	}
	n.readAt = time.Now()
	list, err := n.list()
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
	return mx.Addr{MAC: m, EP: mxlan.Endpoint}, nil
}

// bind checks that a, a node address a stream claims, belongs to the host
// with MAC from: the neighbour table must map a to from (MXTransport.Bind).
// The table learns a node when its daemon starts (node.Open prompts the
// gateway host). An address it does not know is resolved with a datagram
// to the address, as the node daemon resolves its gateways, when wait is
// set; the kernel then asks the LAN who holds it, and the host that does
// answers.
func (n *neighbors) bind(a netip.Addr, from mx.MAC, wait bool) error {
	got, ok := n.lookup(a, from, time.Second)
	if !ok && wait {
		prompt(a)
		for deadline := time.Now().Add(bindWait); !ok && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			got, ok = n.lookup(a, from, 10*time.Millisecond)
		}
	}
	switch {
	case !ok && !wait:
		return fmt.Errorf("%v: %w", a, errUnresolved)
	case !ok:
		return fmt.Errorf("%v is not in the neighbour table of the LAN interface after %v: no host answered for it", a, bindWait)
	case got != from:
		return fmt.Errorf("the neighbour table of the LAN interface gives %v to %v", a, got)
	}
	return nil
}

// lookup finds a's MAC in the table, re-read (if older than d) when a is
// missing or has another MAC than want.
func (n *neighbors) lookup(a netip.Addr, want mx.MAC, d time.Duration) (mx.MAC, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.byIP[a]
	if !ok || m != want {
		n.refreshAfter(d)
		m, ok = n.byIP[a]
	}
	return m, ok
}

// prompt sends one empty datagram to a's discard port, which makes the
// kernel resolve a first.
func prompt(a netip.Addr) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9)))
	if err != nil {
		return
	}
	c.Write([]byte{0})
	c.Close()
}
