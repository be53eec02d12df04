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

// TestMinRTTStamp: the stamp is placed between the two samples around a
// min_rtt change or the end of a PROBE_RTT, is unknown before the first
// change and during PROBE_RTT, and Forget drops it.
func TestMinRTTStamp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	bw := func(min time.Duration) *BBR {
		return &BBR{Bandwidth: 25e6, MinRTT: min, PacingGain: 1, CwndGain: 2}
	}
	probe := func(min time.Duration) *BBR {
		return &BBR{Bandwidth: 25e6, MinRTT: min, PacingGain: 1, CwndGain: 1}
	}
	var m MinRTTStamp
	expect := func(what string, ok bool, from, to int) {
		t.Helper()
		f, e, got := m.Expiry()
		if got != ok {
			t.Fatalf("%s: known %v, want %v", what, got, ok)
		}
		if !ok {
			return
		}
		wf := at(from).Add(BBRMinRTTWindow)
		we := at(to).Add(BBRMinRTTWindow + jiffySlack)
		if !f.Equal(wf) || !e.Equal(we) {
			t.Fatalf("%s: expiry (%v, %v], want (%v, %v]", what, f.Sub(t0), e.Sub(t0), wf.Sub(t0), we.Sub(t0))
		}
	}
	m.Observe(at(0), bw(20*time.Millisecond))
	expect("first sample", false, 0, 0)
	m.Observe(at(5), bw(20*time.Millisecond))
	expect("no change", false, 0, 0)
	m.Observe(at(10), bw(19*time.Millisecond))
	expect("lower min", true, 5, 10)
	m.Observe(at(15), bw(19*time.Millisecond))
	expect("same min", true, 5, 10)
	m.Observe(at(10020), probe(21*time.Millisecond))
	expect("in PROBE_RTT", false, 0, 0)
	m.Observe(at(10250), probe(21*time.Millisecond))
	m.Observe(at(10255), bw(21*time.Millisecond))
	expect("PROBE_RTT ended", true, 10250, 10255)
	m.Observe(at(12000), bw(22*time.Millisecond)) // an expired filter replaced by a higher sample
	expect("higher min", true, 10255, 12000)
	m.Forget()
	expect("forgotten", false, 0, 0)
	m.Observe(at(12005), bw(22*time.Millisecond))
	expect("no change after Forget", false, 0, 0)
	m.Observe(at(12010), &BBR{MinRTT: 5 * time.Millisecond, PacingGain: 1, CwndGain: 1})
	expect("a fresh socket's 1/1 gains are not PROBE_RTT", true, 12005, 12010)

	var b MinRTTStamp
	b.Begin(at(-30))
	b.Observe(at(2), bw(20*time.Millisecond))
	if f, e, ok := b.Expiry(); !ok || !f.Equal(at(-30).Add(BBRMinRTTWindow)) || !e.Equal(at(2).Add(BBRMinRTTWindow+jiffySlack)) {
		t.Errorf("after Begin: expiry (%v, %v] known %v, want (-30ms, 2ms] + 10 s", f.Sub(t0), e.Sub(t0), ok)
	}
}
