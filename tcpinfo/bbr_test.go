package tcpinfo

import (
	"encoding/binary"
	"net"
	"testing"
	"time"
)

func readBBR(t *testing.T, c *net.TCPConn) (BBR, bool) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var b BBR
	var ok bool
	var rerr error
	rc.Control(func(fd uintptr) { ok, rerr = ReadBBR(int(fd), &b) })
	if rerr != nil {
		t.Fatal(rerr)
	}
	return b, ok
}

// TestReadBBR: a BBR socket exports its model (a fresh one is in STARTUP,
// one that has sent 32 MiB in PROBE_BW with a bandwidth and a min RTT); a
// CUBIC socket exports none.
func TestReadBBR(t *testing.T) {
	c := tcpPair(t, "bbr")
	b, ok := readBBR(t, c)
	if !ok {
		t.Fatal("a bbr socket returned no tcp_bbr_info")
	}
	if b.Mode() != BBRStartup {
		t.Errorf("fresh socket: mode %v (gains %.2f/%.2f), want startup", b.Mode(), b.PacingGain, b.CwndGain)
	}
	buf := make([]byte, 1<<20)
	for range 32 {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	waitAcked(t, c)
	b, _ = readBBR(t, c)
	if b.Bandwidth == 0 || b.MinRTT <= 0 || b.MinRTT > time.Second || b.Mode() != BBRProbeBW {
		t.Errorf("after 32 MiB: %+v, want a bandwidth and a loopback min RTT", b)
	}
	if _, ok := readBBR(t, tcpPair(t, "cubic")); ok {
		t.Error("a cubic socket returned tcp_bbr_info")
	}
}

func bbrInfo(bw uint64, minRTTus, pacing, cwnd uint32) []byte {
	p := make([]byte, bbrInfoSize)
	ne := binary.NativeEndian
	ne.PutUint32(p[0:], uint32(bw))
	ne.PutUint32(p[4:], uint32(bw>>32))
	ne.PutUint32(p[8:], minRTTus)
	ne.PutUint32(p[12:], pacing)
	ne.PutUint32(p[16:], cwnd)
	return p
}

// TestBBRModes: the gains of each phase as tcp_bbr.c sets them (BBR_UNIT
// 256) map to their mode.
func TestBBRModes(t *testing.T) {
	const high = 256*2885/1000 + 1
	for _, c := range []struct {
		pacing, cwnd uint32
		want         BBRMode
	}{
		{high, high, BBRStartup},
		{256 * 1000 / 2885, high, BBRDrain},
		{256 * 5 / 4, 512, BBRProbeBW},
		{256 * 3 / 4, 512, BBRProbeBW},
		{256, 512, BBRProbeBW},
		{256, 256, BBRProbeRTT},
	} {
		var b BBR
		if err := DecodeBBR(bbrInfo(5<<32|7, 20000, c.pacing, c.cwnd), &b); err != nil {
			t.Fatal(err)
		}
		if b.Mode() != c.want {
			t.Errorf("gains %d/%d: mode %v, want %v", c.pacing, c.cwnd, b.Mode(), c.want)
		}
		if b.Bandwidth != 5<<32|7 || b.MinRTT != 20*time.Millisecond {
			t.Errorf("decoded %+v", b)
		}
	}
	// A socket without a bandwidth sample yet reports gains of 1.
	var b BBR
	if err := DecodeBBR(bbrInfo(0, 46, 256, 256), &b); err != nil || b.Mode() != BBRStartup {
		t.Errorf("no bandwidth yet, gains 1/1: mode %v (%v), want startup", b.Mode(), err)
	}
	if err := DecodeBBR(make([]byte, 16), &b); err == nil {
		t.Error("a 16-byte struct (vegas, dctcp) decoded as tcp_bbr_info")
	}
}

// TestTrackerProbeRTT: each entry into PROBE_RTT counts once, and its time
// is counted when it ends.
func TestTrackerProbeRTT(t *testing.T) {
	var tr Tracker
	bw := BBR{Bandwidth: 1, PacingGain: 1, CwndGain: 2}
	rtt := BBR{Bandwidth: 1, PacingGain: 1, CwndGain: 1}
	t0 := time.Unix(1000, 0)
	seq := []BBR{bw, rtt, rtt, rtt, bw, bw, rtt, bw}
	for i, b := range seq {
		tr.UpdateBBR(t0.Add(time.Duration(i)*100*time.Millisecond), &b)
	}
	if tr.C.ProbeRTTs != 2 || tr.C.ProbeRTTTime != 400*time.Millisecond {
		t.Errorf("%d dips over %v, want 2 over 400ms", tr.C.ProbeRTTs, tr.C.ProbeRTTTime)
	}
	if last, ok := tr.LastBBR(); !ok || last.Mode() != BBRProbeBW {
		t.Errorf("last sample %+v %v", last, ok)
	}
}
