package testbed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Ping sends count ICMP echo requests from host `from` to host `to`, one
// every interval, and returns the round-trip times of the replies received
// (lost ones are left out). It uses a raw socket opened inside `from`.
func (l *Lab) Ping(ctx context.Context, from, to string, count int, interval time.Duration) ([]time.Duration, error) {
	if _, err := l.host(to); err != nil {
		return nil, err
	}
	return l.PingAddr(ctx, from, l.Addr(to), count, interval)
}

// PingAddr is Ping to an address (e.g. a gateway's WAN leg).
func (l *Lab) PingAddr(ctx context.Context, from string, dst netip.Addr, count int, interval time.Duration) ([]time.Duration, error) {
	to := dst.String()
	if !dst.Is4() {
		return nil, fmt.Errorf("ping: %v is not an IPv4 address", dst)
	}
	var fd int
	err := l.Do(from, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ping from %s: %w", from, err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	id := uint16(os.Getpid()) ^ uint16(time.Now().UnixNano())
	sa := &unix.SockaddrInet4{Addr: dst.As4()}
	var rtts []time.Duration
	buf := make([]byte, 1500)
	msg := make([]byte, 64)
	timeout := time.Second + 3*l.st.Config.MaxRTT()
	for seq := 0; seq < count; seq++ {
		if err := ctx.Err(); err != nil {
			return rtts, err
		}
		msg[0], msg[1] = 8, 0 // echo request
		binary.BigEndian.PutUint16(msg[2:], 0)
		binary.BigEndian.PutUint16(msg[4:], id)
		binary.BigEndian.PutUint16(msg[6:], uint16(seq))
		binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
		sent := time.Now()
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return rtts, fmt.Errorf("ping %s: %w", to, err)
		}
		for time.Since(sent) < timeout {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return rtts, err
			}
			rtt := time.Since(sent)
			if n < 20 {
				continue
			}
			ihl := int(buf[0]&0x0f) * 4
			if n < ihl+8 {
				continue
			}
			icmp := buf[ihl:n]
			if icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id && binary.BigEndian.Uint16(icmp[6:]) == uint16(seq) {
				rtts = append(rtts, rtt)
				break
			}
		}
		if wait := interval - time.Since(sent); wait > 0 && seq < count-1 {
			time.Sleep(wait)
		}
	}
	return rtts, nil
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// median of durations (0 if empty).
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// calibrationDelay is the one-way delay the emulator holds packets during
// calibration: long enough that the writer really sleeps, as it does later.
const calibrationDelay = time.Millisecond

// calibrationGap is the time between calibration pings.
const calibrationGap = 10 * time.Millisecond

// calibrate measures what the packet path itself adds to a round trip
// (veths, bridge, routing, TUN, thread wake-ups; ~0.4 ms here) with a known
// emulated delay and without loss or jitter, then sets the emulated one-way
// delay to RTT/2 minus half of that, so ping RTT matches --rtt.
func (l *Lab) calibrate(ctx context.Context) error {
	c := &l.st.Config
	if err := l.setEmu(emuSet{OneWay: calibrationDelay}); err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	a, b := l.Hosts(c.Sites[0], true)[0], l.Hosts(c.Sites[1], true)[0]
	// Warm up ARP/neighbour entries, then measure.
	if _, err := l.Ping(ctx, a, b, 3, 5*time.Millisecond); err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	// Pings 10 ms apart: the path's cost depends on how long its CPUs were
	// idle before a packet (here +20 us at 2 ms gaps, +55 us at 10 ms,
	// +150 us at 30 ms; the emulator's own lateness stays ~30 us), so
	// calibrate at the idle gaps of ping-pongs and bursty MPI traffic, not
	// on a path kept warm (4 ms gaps left 5 ms labs ~1 % slow).
	rtts, err := l.Ping(ctx, a, b, 25, calibrationGap)
	if err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	if len(rtts) < 10 {
		return fmt.Errorf("calibrate: only %d of 25 pings from %s to %s answered: the lab's WAN does not forward", len(rtts), a, b)
	}
	cost := median(rtts) - 2*calibrationDelay
	if cost < 0 {
		cost = 0
	}
	// Every pair crosses the same router and TUNs: one path cost for all.
	oneway := pairOneWay(c.RTT, cost)
	l.st.PathCost, l.st.OneWay = cost, oneway
	set := []emuSet{{OneWay: oneway, Jitter: c.Jitter, Loss: c.Loss, Reorder: c.Reorder, ReorderDelay: c.ReorderDelay}}
	for _, p := range c.Pairs {
		set = append(set, emuSet{A: p.A, B: p.B, OneWay: pairOneWay(p.RTT, cost), Jitter: p.Jitter, Loss: p.Loss,
			Reorder: p.Reorder, ReorderDelay: p.ReorderDelay})
	}
	if err := l.setEmu(set...); err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	return nil
}

// pairOneWay is the one-way delay that makes a pair's ping RTT match rtt
// on a path that itself costs cost per round trip.
func pairOneWay(rtt, cost time.Duration) time.Duration {
	return max(0, rtt/2-cost/2)
}
