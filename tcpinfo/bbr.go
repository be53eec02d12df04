package tcpinfo

import (
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BBR is what Linux's BBR exports of its model through TCP_CC_INFO (struct
// tcp_bbr_info). TCP_INFO alone cannot tell BBR's PROBE_RTT dips (cwnd held
// at 4 segments for at least 200 ms) from loss: these gains can.
type BBR struct {
	Bandwidth  uint64        // estimated bottleneck bandwidth, bytes/s
	MinRTT     time.Duration // BBR's windowed min RTT (10 s window)
	PacingGain float64       // 2.89 STARTUP, 0.35 DRAIN, 0.75-1.25 PROBE_BW, 1 PROBE_RTT
	CwndGain   float64       // 2.89 STARTUP/DRAIN, 2 PROBE_BW, 1 PROBE_RTT
}

// BBRMode is BBR's state-machine phase.
type BBRMode int

const (
	BBRStartup BBRMode = iota
	BBRDrain
	BBRProbeBW
	BBRProbeRTT
)

func (m BBRMode) String() string {
	switch m {
	case BBRStartup:
		return "startup"
	case BBRDrain:
		return "drain"
	case BBRProbeBW:
		return "probe_bw"
	case BBRProbeRTT:
		return "probe_rtt"
	}
	return fmt.Sprintf("BBRMode(%d)", int(m))
}

// Mode derives the phase from the gains, which the kernel sets per phase
// (tcp_bbr.c, bbr_update_gains): only PROBE_RTT runs the cwnd at gain 1,
// only DRAIN paces below 0.5, and STARTUP and DRAIN share the high cwnd
// gain. Before its first bandwidth sample a socket reports gains of 1 (seen
// on Linux 6.18) although it is in STARTUP; PROBE_RTT needs a model, so a
// zero bandwidth means STARTUP.
func (b *BBR) Mode() BBRMode {
	switch {
	case b.Bandwidth == 0:
		return BBRStartup
	case b.CwndGain < 1.5:
		return BBRProbeRTT
	case b.CwndGain < 2.5:
		return BBRProbeBW
	case b.PacingGain < 0.5:
		return BBRDrain
	}
	return BBRStartup
}

// bbrInfoSize is sizeof(struct tcp_bbr_info): bw_lo, bw_hi, min_rtt (µs),
// pacing_gain, cwnd_gain (<<8), all u32.
const bbrInfoSize = 20

// ReadBBR reads TCP_CC_INFO of socket fd into b. ok is false when the
// socket's congestion control exports no BBR state (cubic exports nothing;
// other algorithms a struct of their own size); the caller should know the
// algorithm (CongestionControl) since vegas and dctcp export other structs.
func ReadBBR(fd int, b *BBR) (ok bool, err error) {
	var buf [64]byte
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_CC_INFO,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		if e == unix.EOPNOTSUPP || e == unix.ENOPROTOOPT {
			return false, ErrNotTCP
		}
		return false, fmt.Errorf("tcpinfo: getsockopt(%d, TCP_CC_INFO): %w", fd, e)
	}
	if n != bbrInfoSize {
		return false, nil
	}
	return true, DecodeBBR(buf[:n], b)
}

// DecodeBBR decodes a struct tcp_bbr_info (native byte order).
func DecodeBBR(p []byte, b *BBR) error {
	if len(p) != bbrInfoSize {
		return fmt.Errorf("tcpinfo: tcp_bbr_info of %d bytes, want %d", len(p), bbrInfoSize)
	}
	ne := binary.NativeEndian
	*b = BBR{
		Bandwidth:  uint64(ne.Uint32(p[0:])) | uint64(ne.Uint32(p[4:]))<<32,
		MinRTT:     time.Duration(ne.Uint32(p[8:])) * time.Microsecond,
		PacingGain: float64(ne.Uint32(p[12:])) / 256,
		CwndGain:   float64(ne.Uint32(p[16:])) / 256,
	}
	return nil
}

// UpdateBBR takes a BBR sample of the tracker's connection taken at time
// at: it keeps the last one (LastBBR) and counts the entries into
// PROBE_RTT. Samples must come closer together than 200 ms (the shortest
// PROBE_RTT) for the count to be complete.
func (t *Tracker) UpdateBBR(at time.Time, cur *BBR) {
	if cur.Mode() == BBRProbeRTT {
		if !t.inProbeRTT {
			t.C.ProbeRTTs++
			t.probeRTTSince = at
		}
		t.inProbeRTT = true
	} else {
		if t.inProbeRTT {
			t.C.ProbeRTTTime += at.Sub(t.probeRTTSince)
		}
		t.inProbeRTT = false
	}
	t.bbr, t.haveBBR = *cur, true
}

// LastBBR returns the last BBR sample, if any.
func (t *Tracker) LastBBR() (BBR, bool) { return t.bbr, t.haveBBR }

// BBRMinRTTWindow is the length of BBR's min_rtt filter (tcp_bbr.c,
// bbr_min_rtt_win_sec). A socket whose min_rtt stamp is this old enters
// PROBE_RTT on its next ACK, unless that ACK ends a restart from idle.
const BBRMinRTTWindow = 10 * time.Second

// jiffySlack covers the filter's clock: the kernel stamps min_rtt in
// jiffies and expires it strictly after the window, so expiry can come up
// to one tick (10 ms at HZ=100, the coarsest Linux runs) after stamp + 10 s.
const jiffySlack = 10 * time.Millisecond

// MinRTTStamp follows, from samples taken outside the kernel, when BBR last
// stamped its min_rtt estimate, and so when the filter will expire. The
// kernel does not export the stamp; it is set when
//   - a sample replaces min_rtt (the exported value changes),
//   - PROBE_RTT ends (the exported gains leave 1/1),
//
// so a change seen between two samples places the stamp between them. A
// sample equal to min_rtt also restamps it, invisibly: callers must treat an
// expiry that passes without a change or a PROBE_RTT as a sign the estimate
// went stale (Forget).
type MinRTTStamp struct {
	lo, hi time.Time // the stamp lies in (lo, hi]
	known  bool
	have   bool
	begin  time.Time     // Begin's bound, for the first sample
	last   time.Time     // previous sample
	min    time.Duration // its min_rtt
	probe  bool          // it was in PROBE_RTT
}

// Observe takes the BBR sample b read at time at (samples in time order).
func (m *MinRTTStamp) Observe(at time.Time, b *BBR) {
	probe := b.Mode() == BBRProbeRTT // Mode says STARTUP while Bandwidth is 0
	switch {
	case !m.have:
		m.have = true
		// BBR stamps min_rtt when it starts (bbr_init, as the connection
		// is established), and the caller knows since when that may be.
		if !m.begin.IsZero() && !probe {
			m.lo, m.hi, m.known = m.begin, at, true
		}
	case probe:
		// PROBE_RTT restamps when it ends; until then no expiry applies.
		m.known = false
	case m.probe || b.MinRTT != m.min:
		m.lo, m.hi, m.known = m.last, at, true
	}
	m.last, m.min, m.probe = at, b.MinRTT, probe
}

// Begin tells that the socket's BBR state was initialised, which stamps
// min_rtt, no earlier than t: the first sample then places the stamp
// between t and itself. Call it before the first Observe.
func (m *MinRTTStamp) Begin(t time.Time) {
	if !m.have {
		m.begin = t
	}
}

// Expiry returns when the filter expires: not before from, not after to.
// ok is false while the stamp is unknown.
func (m *MinRTTStamp) Expiry() (from, to time.Time, ok bool) {
	if !m.known {
		return from, to, false
	}
	return m.lo.Add(BBRMinRTTWindow), m.hi.Add(BBRMinRTTWindow + jiffySlack), true
}

// Forget drops the stamp until the next visible change: the caller saw an
// expiry pass without its consequences (an invisible restamp).
func (m *MinRTTStamp) Forget() { m.known = false }
