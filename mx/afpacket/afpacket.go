//go:build linux

// Package afpacket carries the MX engine's frames on a real interface: an
// AF_PACKET SOCK_RAW socket bound to the interface and EtherType 0x88B5,
// one read or write system call per frame.
//
// Why not a TPACKET ring (gopacket's afpacket): TPACKET_V3 hands frames to
// the reader a block at a time and retires a partly filled block on a timer
// counted in milliseconds (tp_retire_blk_tov), so a lone small message
// waits up to that timeout, a hundred LAN round trips; TPACKET_V2 is per
// frame but gopacket's binding needs cgo, which the gateway does not. A
// plain socket delivers each frame as it comes, and its cost per frame (one
// system call) is measured against kernel TCP in bench/figures/mx.
package afpacket

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/mx/wire"
)

// Link is an mx.Link on one interface.
type Link struct {
	fd     int
	file   *os.File        // netpoller mode: fd registered with Go's poller
	rc     syscall.RawConn // its raw access
	mac    mx.MAC
	mtu    int
	ifname string
	closed atomic.Bool
}

// pollEvery bounds how long a Recv blocked in the kernel takes to notice
// Close (a packet socket's read is not woken by close from another thread).
const pollEvery = 100 * time.Millisecond

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Open binds a raw socket to the interface ifname in the caller's network
// namespace. It needs CAP_NET_RAW. The socket is non-blocking and waits in
// Go's network poller, as Go's own TCP sockets do: a read blocked in the
// kernel instead costs a thread hand-off on every wake-up, measured in
// bench/figures/mx (mx vs mx-blocking).
func Open(ifname string) (*Link, error) { return open(ifname, false) }

func open(ifname string, blocking bool) (*Link, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("mx/afpacket: interface %q: %w (name a LAN interface of this host, e.g. eth0)", ifname, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("mx/afpacket: interface %q has no Ethernet address (MX needs an Ethernet LAN)", ifname)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(wire.EtherType)))
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("mx/afpacket: raw socket: %w (needs CAP_NET_RAW: run as root or setcap cap_net_raw+ep)", err)
		}
		return nil, fmt.Errorf("mx/afpacket: raw socket: %w", err)
	}
	fail := func(what string, err error) (*Link, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("mx/afpacket: %s on %q: %w", what, ifname, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(wire.EtherType), Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	// Frames this host sends from other sockets (another engine on the same
	// interface) must not come back as received ones.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return fail("PACKET_IGNORE_OUTGOING", err)
	}
	// The engine keeps its own window; skipping the qdisc saves a lock and
	// a queue per frame on the send path.
	unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1)
	tv := unix.NsecToTimeval(pollEvery.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("SO_RCVTIMEO", err)
	}
	// Room for a full window of frames arriving while the reader is off
	// the CPU: a 2-vCPU host deschedules it for milliseconds.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	l := &Link{fd: fd, mtu: min(ifi.MTU, wire.MaxFrame), ifname: ifname}
	copy(l.mac[:], ifi.HardwareAddr)
	if !blocking {
		if err := unix.SetNonblock(fd, true); err != nil {
			return fail("O_NONBLOCK", err)
		}
		l.file = os.NewFile(uintptr(fd), "mx-"+ifname)
		if l.rc, err = l.file.SyscallConn(); err != nil {
			l.file.Close()
			return nil, fmt.Errorf("mx/afpacket: poller on %q: %w", ifname, err)
		}
	}
	return l, nil
}

func (l *Link) MAC() mx.MAC { return l.mac }
func (l *Link) MTU() int    { return l.mtu }

// Send writes one frame; the socket is bound, so write needs no address.
func (l *Link) Send(frame []byte) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	if l.rc != nil {
		var err error
		// Never wait for room: the engine holds its lock here, and a frame
		// the NIC cannot take is a loss the engine repairs.
		cerr := l.rc.Write(func(fd uintptr) bool {
			for {
				_, err = unix.Write(int(fd), frame)
				if !errors.Is(err, unix.EINTR) {
					return true
				}
			}
		})
		if cerr != nil {
			return net.ErrClosed
		}
		if err == nil || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
			return nil
		}
		return fmt.Errorf("mx/afpacket: send on %q: %w", l.ifname, err)
	}
	for {
		_, err := unix.Write(l.fd, frame)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOBUFS), errors.Is(err, unix.EAGAIN):
			return nil // the NIC queue is full: a lost frame, which the engine repairs
		}
		if l.closed.Load() {
			return net.ErrClosed
		}
		return fmt.Errorf("mx/afpacket: send on %q: %w", l.ifname, err)
	}
}

// Recv reads the next frame into buf.
func (l *Link) Recv(buf []byte) (int, error) {
	if l.rc != nil {
		var n int
		var err error
		cerr := l.rc.Read(func(fd uintptr) bool {
			n, err = unix.Read(int(fd), buf)
			return !errors.Is(err, unix.EAGAIN)
		})
		if cerr != nil {
			return 0, net.ErrClosed
		}
		if err != nil {
			return 0, fmt.Errorf("mx/afpacket: receive on %q: %w", l.ifname, err)
		}
		return n, nil
	}
	for {
		if l.closed.Load() {
			return 0, net.ErrClosed
		}
		n, err := unix.Read(l.fd, buf)
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		}
		if l.closed.Load() {
			return 0, net.ErrClosed
		}
		return 0, fmt.Errorf("mx/afpacket: receive on %q: %w", l.ifname, err)
	}
}

// Close stops Recv within pollEvery and releases the socket.
func (l *Link) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	if l.file != nil {
		return l.file.Close() // wakes a waiting Recv
	}
	// A blocked read returns within pollEvery and sees the flag; the fd is
	// closed only after that, so no read or write uses a reused number.
	go func() {
		time.Sleep(2 * pollEvery)
		unix.Close(l.fd)
	}()
	return nil
}
