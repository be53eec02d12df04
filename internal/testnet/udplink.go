package testnet

import (
	"net"

	"github.com/mpi5k/mpi5k/mx"
)

// UDPLink carries MX frames as UDP datagrams on loopback, so MX engines in
// several processes (a node daemon a test kills, a benchmark's gateways
// and load) share a LAN without raw sockets and without a descriptor per
// stream. A MAC names its UDP port: 02:00:00:00:hi:lo.
type UDPLink struct {
	c   *net.UDPConn
	mac mx.MAC
}

// UDPMAC is the MAC of the link on UDP port port of 127.0.0.1.
func UDPMAC(port int) mx.MAC { return mx.MAC{2, 0, 0, 0, byte(port >> 8), byte(port)} }

// OpenUDPLink opens a link on UDP port port of 127.0.0.1 (0: a free one).
func OpenUDPLink(port int) (*UDPLink, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return nil, err
	}
	c.SetReadBuffer(4 << 20)
	return &UDPLink{c: c, mac: UDPMAC(c.LocalAddr().(*net.UDPAddr).Port)}, nil
}

// Port is the link's UDP port.
func (l *UDPLink) Port() int { return l.c.LocalAddr().(*net.UDPAddr).Port }

func (l *UDPLink) Send(f []byte) error {
	port := int(f[4])<<8 | int(f[5])
	_, err := l.c.WriteToUDP(f, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	return err
}
func (l *UDPLink) Recv(b []byte) (int, error) { n, _, err := l.c.ReadFromUDP(b); return n, err }
func (l *UDPLink) MAC() mx.MAC                { return l.mac }
func (l *UDPLink) MTU() int                   { return 1500 }
func (l *UDPLink) Close() error               { return l.c.Close() }

var _ mx.Link = (*UDPLink)(nil)
