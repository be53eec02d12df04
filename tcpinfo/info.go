// Package tcpinfo reads the kernel's TCP_INFO for a socket, decodes it,
// samples sets of sockets cheaply and derives events from consecutive
// samples: retransmissions and their kind (fast retransmit vs RTO), lost and
// reordered segments, cwnd/ssthresh changes, restarts after idle, the share
// of time limited by the receiver window or the send buffer, RTT statistics.
//
// No kernel patch is needed (the original work used Web100 and a modified
// tcp_probe); what TCP_INFO does not say is approximated, and the
// approximations are documented where they are made.
//
// Use: Read(fd, &raw, &info) for one sample (one getsockopt, ~1 µs, no
// allocation); a Tracker per connection turns consecutive samples into
// Events and Counters; a Sampler does both for a set of sockets, on demand
// or periodically.
//
// The raw struct is decoded by hand with the documented offsets and the
// length the kernel returned, so fields a kernel does not have are known to
// be absent (Info.Has) rather than silently zero: x/sys's
// GetsockoptTCPInfo hides that length.
//
// Facts observed on Linux 6.18 that matter when reading the results:
//   - Restart after idle (tcp_slow_start_after_idle=1, the default) applies
//     to reno/cubic only: Linux skips it for congestion controls with their
//     own cong_control, i.e. BBR -- this machine's default. A cubic socket
//     idle for more than one RTO has cwnd halved per RTO of idleness down
//     to 10 segments (seen on loopback: 22 -> 10 after 450 ms, rto 204 ms).
//   - Even loopback can retransmit: with the receiver starved of CPU the
//     sender's tail loss probe fires, and the peer reports it as a D-SACK
//     duplicate (DSACKDups), i.e. a spurious retransmission.
//   - The busy/rwnd/sndbuf-limited times have jiffy resolution (4 ms at
//     HZ=250).
package tcpinfo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RawSize is the size of the buffer handed to getsockopt: larger than any
// struct tcp_info so far (280 bytes in Linux 6.18), so that a newer kernel
// never truncates the fields we know.
const RawSize = 512

// Congestion-avoidance states (tcpi_ca_state, enum tcp_ca_state).
const (
	CAOpen     = 0 // normal
	CADisorder = 1 // SACKs or dup ACKs seen, no retransmission yet
	CACWR      = 2 // cwnd reduced by ECN or local congestion
	CARecovery = 3 // fast retransmit / fast recovery
	CALoss     = 4 // retransmission timeout: cwnd collapsed to 1
)

// InfiniteSsthresh is the kernel's "no slow start threshold yet"
// (TCP_INFINITE_SSTHRESH).
const InfiniteSsthresh = 0x7fffffff

// Info is one decoded TCP_INFO. Durations are converted from the kernel's
// units (µs for RTT/RTO/chrono times, ms for last_* and total_rto_time).
// Fields the kernel did not return (older kernels return a shorter struct,
// see Len and Has) are zero.
type Info struct {
	Len int // bytes the kernel returned

	State       uint8 // TCP_ESTABLISHED = 1, ...
	CAState     uint8 // CAOpen ... CALoss
	Retransmits uint8 // consecutive RTOs of the current episode (icsk_retransmits)
	Probes      uint8 // zero-window / keepalive probes sent without answer
	Backoff     uint8 // RTO exponential backoff shift
	Options     uint8 // TCPI_OPT_* bits
	SndWscale   uint8
	RcvWscale   uint8
	// DeliveryRateAppLimited: the delivery rate sample was taken while the
	// application, not the network, limited sending.
	DeliveryRateAppLimited bool

	RTO, ATO     time.Duration
	SndMSS       uint32
	RcvMSS       uint32
	Unacked      uint32 // segments in flight (packets_out)
	Sacked       uint32
	Lost         uint32 // segments currently marked lost (a gauge, not a total)
	Retrans      uint32 // segments currently retransmitted and unacknowledged
	Fackets      uint32
	LastDataSent time.Duration // since the last data segment was sent
	LastAckSent  time.Duration // not tracked by Linux (always 0)
	LastDataRecv time.Duration
	LastAckRecv  time.Duration
	PMTU         uint32
	RcvSsthresh  uint32
	RTT, RTTVar  time.Duration // smoothed RTT and its mean deviation
	SndSsthresh  uint32        // segments; InfiniteSsthresh before the first reduction
	SndCwnd      uint32        // segments
	AdvMSS       uint32
	Reordering   uint32 // current reordering degree estimate (segments)
	RcvRTT       time.Duration
	RcvSpace     uint32
	TotalRetrans uint32 // segments retransmitted over the connection's life

	PacingRate    uint64 // bytes/s
	MaxPacingRate uint64 // bytes/s
	BytesAcked    uint64
	BytesReceived uint64
	SegsOut       uint32
	SegsIn        uint32
	NotsentBytes  uint32 // bytes in the send queue not yet sent
	MinRTT        time.Duration
	DataSegsIn    uint32
	DataSegsOut   uint32
	DeliveryRate  uint64 // bytes/s, latest delivery rate sample

	// BusyTime is the time the connection had data to send (all of it);
	// RwndLimited and SndbufLimited are the parts of it limited by the
	// peer's receive window and by the local send buffer. The rest was
	// limited by the congestion window (or pacing). Jiffy resolution.
	BusyTime      time.Duration
	RwndLimited   time.Duration
	SndbufLimited time.Duration

	Delivered    uint32
	DeliveredCE  uint32
	BytesSent    uint64 // including retransmissions
	BytesRetrans uint64
	DSACKDups    uint32 // duplicate segments reported by D-SACK (spurious retransmits)
	ReordSeen    uint32 // reordering events seen
	RcvOOOPack   uint32 // out-of-order packets received
	SndWnd       uint32 // peer's advertised receive window, bytes
	RcvWnd       uint32 // our advertised receive window, bytes
	Rehash       uint32 // PLB/timeout rehashes

	TotalRTO           uint16        // retransmission timeouts over the life (6.7+)
	TotalRTORecoveries uint16        // RTO recovery episodes (6.7+)
	TotalRTOTime       time.Duration // time spent in RTO recoveries (6.7+)
}

// Field offsets in struct tcp_info (include/uapi/linux/tcp.h); the kernel
// only ever appends fields, so a field is present iff its end is within the
// returned length. TestOffsetsMatchXSys checks them against x/sys/unix.
const (
	offState              = 0   // u8 tcpi_state
	offCAState            = 1   // u8 tcpi_ca_state
	offRetransmits        = 2   // u8
	offProbes             = 3   // u8
	offBackoff            = 4   // u8
	offOptions            = 5   // u8
	offWscale             = 6   // u8: snd_wscale:4 (low nibble), rcv_wscale:4
	offAppLimited         = 7   // u8: delivery_rate_app_limited:1, fastopen_client_fail:2
	offRTO                = 8   // u32 µs
	offATO                = 12  // u32 µs
	offSndMSS             = 16  // u32
	offRcvMSS             = 20  // u32
	offUnacked            = 24  // u32
	offSacked             = 28  // u32
	offLost               = 32  // u32
	offRetrans            = 36  // u32
	offFackets            = 40  // u32
	offLastDataSent       = 44  // u32 ms
	offLastAckSent        = 48  // u32 ms
	offLastDataRecv       = 52  // u32 ms
	offLastAckRecv        = 56  // u32 ms
	offPMTU               = 60  // u32
	offRcvSsthresh        = 64  // u32
	offRTT                = 68  // u32 µs
	offRTTVar             = 72  // u32 µs
	offSndSsthresh        = 76  // u32
	offSndCwnd            = 80  // u32
	offAdvMSS             = 84  // u32
	offReordering         = 88  // u32
	offRcvRTT             = 92  // u32 µs
	offRcvSpace           = 96  // u32
	offTotalRetrans       = 100 // u32
	offPacingRate         = 104 // u64 (Linux 3.15)
	offMaxPacingRate      = 112 // u64
	offBytesAcked         = 120 // u64 (4.1)
	offBytesReceived      = 128 // u64
	offSegsOut            = 136 // u32 (4.2)
	offSegsIn             = 140 // u32
	offNotsentBytes       = 144 // u32 (4.6)
	offMinRTT             = 148 // u32 µs
	offDataSegsIn         = 152 // u32
	offDataSegsOut        = 156 // u32
	offDeliveryRate       = 160 // u64 (4.9)
	offBusyTime           = 168 // u64 µs (4.10)
	offRwndLimited        = 176 // u64 µs
	offSndbufLimited      = 184 // u64 µs
	offDelivered          = 192 // u32 (4.18)
	offDeliveredCE        = 196 // u32
	offBytesSent          = 200 // u64 (4.19)
	offBytesRetrans       = 208 // u64
	offDSACKDups          = 216 // u32
	offReordSeen          = 220 // u32
	offRcvOOOPack         = 224 // u32 (5.4)
	offSndWnd             = 228 // u32 (5.4)
	offRcvWnd             = 232 // u32 (6.2)
	offRehash             = 236 // u32 (6.2)
	offTotalRTO           = 240 // u16 (6.7)
	offTotalRTORecoveries = 242 // u16
	offTotalRTOTime       = 244 // u32 ms
	endKnown              = 248
)

// Field names Has understands: the first field of each kernel generation.
const (
	FieldBytesAcked   = offBytesAcked + 8
	FieldNotsentBytes = offNotsentBytes + 4
	FieldBusyTime     = offSndbufLimited + 8
	FieldBytesSent    = offReordSeen + 4 // bytes_sent/retrans, dsack_dups, reord_seen
	FieldSndWnd       = offSndWnd + 4
	FieldTotalRTO     = offTotalRTOTime + 4 // total_rto, total_rto_recoveries, total_rto_time
)

// Has reports whether the kernel returned the fields ending at field (one of
// the Field* constants).
func (in *Info) Has(field int) bool { return in.Len >= field }

// ErrNotTCP is returned for an fd that is not a TCP socket.
var ErrNotTCP = errors.New("tcpinfo: not a TCP socket")

// Raw is a getsockopt buffer; keep one per sampler goroutine to read
// without allocating.
type Raw struct {
	b [RawSize]byte
	n uint32
}

// Bytes returns what the kernel returned by the last ReadRaw.
func (r *Raw) Bytes() []byte { return r.b[:r.n] }

// ReadRaw fills r with TCP_INFO of socket fd: one getsockopt system call.
func ReadRaw(fd int, r *Raw) error {
	r.n = RawSize
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&r.b[0])), uintptr(unsafe.Pointer(&r.n)), 0)
	if e != 0 {
		r.n = 0
		if e == unix.EOPNOTSUPP || e == unix.ENOPROTOOPT {
			return ErrNotTCP
		}
		return fmt.Errorf("tcpinfo: getsockopt(%d, TCP_INFO): %w", fd, e)
	}
	if r.n > RawSize {
		r.n = RawSize
	}
	return nil
}

// Read reads and decodes TCP_INFO of socket fd into in, without allocating
// (r is scratch space; see Raw).
func Read(fd int, r *Raw, in *Info) error {
	if err := ReadRaw(fd, r); err != nil {
		return err
	}
	return Decode(r.Bytes(), in)
}

// ReadConn reads TCP_INFO of a connection (e.g. *net.TCPConn). It allocates
// (SyscallConn); samplers keep the RawConn instead (see Sampler).
func ReadConn(c syscall.Conn, in *Info) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var r Raw
	var rerr error
	if err := rc.Control(func(fd uintptr) { rerr = Read(int(fd), &r, in) }); err != nil {
		return err
	}
	return rerr
}

// Decode decodes a struct tcp_info as returned by the kernel (any length
// from the original 104 bytes on; native byte order) into in.
func Decode(b []byte, in *Info) error {
	if len(b) < offPacingRate {
		return fmt.Errorf("tcpinfo: TCP_INFO of %d bytes, want at least %d", len(b), offPacingRate)
	}
	*in = Info{Len: len(b)}
	ne := binary.NativeEndian
	u32 := func(off int) uint32 {
		if off+4 > len(b) {
			return 0
		}
		return ne.Uint32(b[off:])
	}
	u64 := func(off int) uint64 {
		if off+8 > len(b) {
			return 0
		}
		return ne.Uint64(b[off:])
	}
	us := func(off int) time.Duration { return time.Duration(u32(off)) * time.Microsecond }
	ms := func(off int) time.Duration { return time.Duration(u32(off)) * time.Millisecond }

	in.State = b[offState]
	in.CAState = b[offCAState]
	in.Retransmits = b[offRetransmits]
	in.Probes = b[offProbes]
	in.Backoff = b[offBackoff]
	in.Options = b[offOptions]
	in.SndWscale = b[offWscale] & 0x0f
	in.RcvWscale = b[offWscale] >> 4
	in.DeliveryRateAppLimited = b[offAppLimited]&1 != 0
	in.RTO = us(offRTO)
	in.ATO = us(offATO)
	in.SndMSS = u32(offSndMSS)
	in.RcvMSS = u32(offRcvMSS)
	in.Unacked = u32(offUnacked)
	in.Sacked = u32(offSacked)
	in.Lost = u32(offLost)
	in.Retrans = u32(offRetrans)
	in.Fackets = u32(offFackets)
	in.LastDataSent = ms(offLastDataSent)
	in.LastAckSent = ms(offLastAckSent)
	in.LastDataRecv = ms(offLastDataRecv)
	in.LastAckRecv = ms(offLastAckRecv)
	in.PMTU = u32(offPMTU)
	in.RcvSsthresh = u32(offRcvSsthresh)
	in.RTT = us(offRTT)
	in.RTTVar = us(offRTTVar)
	in.SndSsthresh = u32(offSndSsthresh)
	in.SndCwnd = u32(offSndCwnd)
	in.AdvMSS = u32(offAdvMSS)
	in.Reordering = u32(offReordering)
	in.RcvRTT = us(offRcvRTT)
	in.RcvSpace = u32(offRcvSpace)
	in.TotalRetrans = u32(offTotalRetrans)
	in.PacingRate = u64(offPacingRate)
	in.MaxPacingRate = u64(offMaxPacingRate)
	in.BytesAcked = u64(offBytesAcked)
	in.BytesReceived = u64(offBytesReceived)
	in.SegsOut = u32(offSegsOut)
	in.SegsIn = u32(offSegsIn)
	in.NotsentBytes = u32(offNotsentBytes)
	in.MinRTT = us(offMinRTT)
	in.DataSegsIn = u32(offDataSegsIn)
	in.DataSegsOut = u32(offDataSegsOut)
	in.DeliveryRate = u64(offDeliveryRate)
	in.BusyTime = time.Duration(u64(offBusyTime)) * time.Microsecond
	in.RwndLimited = time.Duration(u64(offRwndLimited)) * time.Microsecond
	in.SndbufLimited = time.Duration(u64(offSndbufLimited)) * time.Microsecond
	in.Delivered = u32(offDelivered)
	in.DeliveredCE = u32(offDeliveredCE)
	in.BytesSent = u64(offBytesSent)
	in.BytesRetrans = u64(offBytesRetrans)
	in.DSACKDups = u32(offDSACKDups)
	in.ReordSeen = u32(offReordSeen)
	in.RcvOOOPack = u32(offRcvOOOPack)
	in.SndWnd = u32(offSndWnd)
	in.RcvWnd = u32(offRcvWnd)
	in.Rehash = u32(offRehash)
	if offTotalRTORecoveries+2 <= len(b) {
		in.TotalRTO = ne.Uint16(b[offTotalRTO:])
		in.TotalRTORecoveries = ne.Uint16(b[offTotalRTORecoveries:])
	}
	in.TotalRTOTime = ms(offTotalRTOTime)
	return nil
}

// CongestionControl returns the socket's congestion control (TCP_CONGESTION).
func CongestionControl(fd int) (string, error) {
	cc, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		return "", fmt.Errorf("tcpinfo: getsockopt(%d, TCP_CONGESTION): %w", fd, err)
	}
	return cc, nil
}
