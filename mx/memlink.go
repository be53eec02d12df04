package mx

import (
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// MemHub is an in-memory Ethernet switch for tests: links attached to it
// exchange frames through bounded queues, and a Fault decides per frame to
// drop, duplicate or delay it (reordering).
type MemHub struct {
	mu    sync.Mutex
	ports map[MAC]*MemLink
	mtu   int
	Fault func(frame []byte) Fault // nil: a perfect LAN
}

// Fault is what happens to one frame.
type Fault struct {
	Drop  bool
	Dup   bool
	Delay time.Duration // delivered later, after frames sent behind it
}

// RandomFault returns a Fault function with the given probabilities, from
// a seeded generator so a failing test can be replayed.
func RandomFault(seed uint64, loss, dup, reorder float64) func([]byte) Fault {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func([]byte) Fault {
		mu.Lock()
		defer mu.Unlock()
		var f Fault
		f.Drop = r.Float64() < loss
		f.Dup = r.Float64() < dup
		if r.Float64() < reorder {
			f.Delay = time.Duration(50+r.IntN(200)) * time.Microsecond
		}
		return f
	}
}

// NewMemHub returns a switch whose links carry MX frames of up to mtu bytes.
func NewMemHub(mtu int) *MemHub { return &MemHub{ports: map[MAC]*MemLink{}, mtu: mtu} }

// Attach returns a new link with address mac.
func (h *MemHub) Attach(mac MAC) *MemLink {
	l := &MemLink{hub: h, mac: mac, q: make(chan []byte, 4096), done: make(chan struct{})}
	h.mu.Lock()
	h.ports[mac] = l
	h.mu.Unlock()
	return l
}

// MemLink is one port of a MemHub.
type MemLink struct {
	hub  *MemHub
	mac  MAC
	q    chan []byte
	done chan struct{}
	once sync.Once
}

var errClosed = errors.New("mx: link closed")

func (l *MemLink) MAC() MAC { return l.mac }
func (l *MemLink) MTU() int { return l.hub.mtu }
func (l *MemLink) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.hub.mu.Lock()
		delete(l.hub.ports, l.mac)
		l.hub.mu.Unlock()
	})
	return nil
}

func (l *MemLink) Send(frame []byte) error {
	select {
	case <-l.done:
		return errClosed
	default:
	}
	var dst MAC
	copy(dst[:], frame)
	l.hub.mu.Lock()
	to := l.hub.ports[dst]
	fault := l.hub.Fault
	l.hub.mu.Unlock()
	if to == nil {
		return nil // like Ethernet: nobody there, the frame is lost
	}
	var f Fault
	if fault != nil {
		f = fault(frame)
	}
	if f.Drop {
		return nil
	}
	n := 1
	if f.Dup {
		n = 2
	}
	for range n {
		c := append([]byte(nil), frame...)
		if f.Delay > 0 {
			time.AfterFunc(f.Delay, func() { to.deliver(c) })
		} else {
			to.deliver(c)
		}
	}
	return nil
}

func (l *MemLink) deliver(b []byte) {
	select {
	case l.q <- b:
	default: // a full receive ring drops, as a NIC's does
	}
}

func (l *MemLink) Recv(buf []byte) (int, error) {
	select {
	case b := <-l.q:
		return copy(buf, b), nil
	case <-l.done:
		return 0, errClosed
	}
}
