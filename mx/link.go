package mx

import (
	"fmt"
	"net"
	"time"

	"github.com/mpi5k/mpi5k/mx/wire"
)

// MAC is an Ethernet address.
type MAC [6]byte

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// ParseMAC parses a colon-separated Ethernet address.
func ParseMAC(s string) (MAC, error) {
	var m MAC
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return m, fmt.Errorf("mx: %q is not a 48-bit MAC address (want e.g. 02:00:00:00:00:01)", s)
	}
	copy(m[:], hw)
	return m, nil
}

// Addr names an endpoint on the LAN: a host's MAC and an endpoint id on it.
type Addr struct {
	MAC MAC
	EP  uint16
}

func (a Addr) String() string { return fmt.Sprintf("%v/%d", a.MAC, a.EP) }

// Link moves whole Ethernet frames (destination MAC, source MAC, EtherType,
// then the MX frame). The engine builds and parses the Ethernet header
// itself, so a link is a thin shim over a raw socket, and tests can put an
// in-memory switch with loss and reordering in its place (MemHub).
type Link interface {
	// Send transmits one frame. The engine reuses frame after Send
	// returns.
	Send(frame []byte) error
	// Recv blocks until a frame arrives and copies it into buf, returning
	// its length. It returns an error once the link is closed.
	Recv(buf []byte) (int, error)
	// MAC is the link's own address; MTU the largest MX frame (Ethernet
	// header excluded) it carries.
	MAC() MAC
	MTU() int
	Close() error
}

// Clock is the engine's time source, replaceable in tests that need
// timeouts without waiting for them.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface{ Stop() bool }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// AfterFunc runs f after d. Go's poller waits in whole milliseconds on
// Linux (runtime/netpoll_epoll.go rounds a shorter wait up to 1 ms), so an
// idle engine's sub-millisecond timers fire late. The delayed ACKs,
// connects and keepalives that run here can be late (a late ACK is
// overtaken by the peer's probe); the tail-loss probe and the RTO run on
// a timerfd on Linux (fdTimer), armed with slack so that it fires rarely:
// a nanosleep(2) goroutine per timer (e5b1593) and a timerfd armed at
// every deadline (abd4404) had cost five and seven times the median round
// trip (bench/figures/mx).
func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// putEth writes the Ethernet header of a frame from src to dst.
func putEth(b []byte, dst, src MAC) {
	copy(b[0:6], dst[:])
	copy(b[6:12], src[:])
	b[12] = wire.EtherType >> 8
	b[13] = wire.EtherType & 0xff
}

// pool is a fixed set of frame buffers allocated once at start: the
// "pre-registered" memory of MX. The receive path never allocates per frame,
// and an exhausted pool is flow control (a smaller window), not growth.
type pool struct {
	free [][]byte
	size int
}

func newPool(n, size int) *pool {
	p := &pool{free: make([][]byte, 0, n), size: size}
	slab := make([]byte, n*size)
	for i := range n {
		p.free = append(p.free, slab[i*size:(i+1)*size:(i+1)*size])
	}
	return p
}

func (p *pool) get() []byte {
	if len(p.free) == 0 {
		return nil
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return b[:p.size]
}

func (p *pool) put(b []byte) { p.free = append(p.free, b[:p.size]) }
