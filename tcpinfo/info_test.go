package tcpinfo

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpPair returns a loopback connection (client side, with congestion
// control cc if not empty) whose server side discards everything.
func tcpPair(t testing.TB, cc string) *net.TCPConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c)
	}()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		if cc == "" {
			return nil
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		if cc != "" {
			t.Skipf("congestion control %s unavailable: %v", cc, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

func readConn(t testing.TB, c *net.TCPConn) Info {
	t.Helper()
	var in Info
	if err := ReadConn(c, &in); err != nil {
		t.Fatal(err)
	}
	return in
}

// waitAcked waits until every byte sent on c is acknowledged.
func waitAcked(t testing.TB, c *net.TCPConn) Info {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		in := readConn(t, c)
		if in.Unacked == 0 && in.NotsentBytes == 0 {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("data still unacknowledged after 5s: %+v", in)
		}
		time.Sleep(time.Millisecond)
	}
}

// The offsets are ours (from include/uapi/linux/tcp.h); x/sys/unix generates
// its struct from the same header: they must agree.
func TestOffsetsMatchXSys(t *testing.T) {
	var x unix.TCPInfo
	for _, f := range []struct {
		name      string
		ours, xsy uintptr
	}{
		{"state", offState, unsafe.Offsetof(x.State)},
		{"ca_state", offCAState, unsafe.Offsetof(x.Ca_state)},
		{"backoff", offBackoff, unsafe.Offsetof(x.Backoff)},
		{"rto", offRTO, unsafe.Offsetof(x.Rto)},
		{"lost", offLost, unsafe.Offsetof(x.Lost)},
		{"last_data_sent", offLastDataSent, unsafe.Offsetof(x.Last_data_sent)},
		{"rtt", offRTT, unsafe.Offsetof(x.Rtt)},
		{"rttvar", offRTTVar, unsafe.Offsetof(x.Rttvar)},
		{"snd_ssthresh", offSndSsthresh, unsafe.Offsetof(x.Snd_ssthresh)},
		{"snd_cwnd", offSndCwnd, unsafe.Offsetof(x.Snd_cwnd)},
		{"reordering", offReordering, unsafe.Offsetof(x.Reordering)},
		{"total_retrans", offTotalRetrans, unsafe.Offsetof(x.Total_retrans)},
		{"pacing_rate", offPacingRate, unsafe.Offsetof(x.Pacing_rate)},
		{"bytes_acked", offBytesAcked, unsafe.Offsetof(x.Bytes_acked)},
		{"segs_out", offSegsOut, unsafe.Offsetof(x.Segs_out)},
		{"notsent_bytes", offNotsentBytes, unsafe.Offsetof(x.Notsent_bytes)},
		{"min_rtt", offMinRTT, unsafe.Offsetof(x.Min_rtt)},
		{"delivery_rate", offDeliveryRate, unsafe.Offsetof(x.Delivery_rate)},
		{"busy_time", offBusyTime, unsafe.Offsetof(x.Busy_time)},
		{"rwnd_limited", offRwndLimited, unsafe.Offsetof(x.Rwnd_limited)},
		{"sndbuf_limited", offSndbufLimited, unsafe.Offsetof(x.Sndbuf_limited)},
		{"delivered", offDelivered, unsafe.Offsetof(x.Delivered)},
		{"bytes_sent", offBytesSent, unsafe.Offsetof(x.Bytes_sent)},
		{"bytes_retrans", offBytesRetrans, unsafe.Offsetof(x.Bytes_retrans)},
		{"dsack_dups", offDSACKDups, unsafe.Offsetof(x.Dsack_dups)},
		{"reord_seen", offReordSeen, unsafe.Offsetof(x.Reord_seen)},
		{"rcv_ooopack", offRcvOOOPack, unsafe.Offsetof(x.Rcv_ooopack)},
		{"snd_wnd", offSndWnd, unsafe.Offsetof(x.Snd_wnd)},
		{"rcv_wnd", offRcvWnd, unsafe.Offsetof(x.Rcv_wnd)},
		{"rehash", offRehash, unsafe.Offsetof(x.Rehash)},
		{"total_rto", offTotalRTO, unsafe.Offsetof(x.Total_rto)},
		{"total_rto_recoveries", offTotalRTORecoveries, unsafe.Offsetof(x.Total_rto_recoveries)},
		{"total_rto_time", offTotalRTOTime, unsafe.Offsetof(x.Total_rto_time)},
	} {
		if f.ours != f.xsy {
			t.Errorf("%s: our offset %d, x/sys %d", f.name, f.ours, f.xsy)
		}
	}
	if unix.SizeofTCPInfo > RawSize {
		t.Errorf("RawSize %d < x/sys SizeofTCPInfo %d", RawSize, unix.SizeofTCPInfo)
	}
}

// TestDecodeSynthetic puts a distinct value in every field at its
// documented offset and checks the decoded Info, for a full struct and for
// the shorter ones older kernels return.
func TestDecodeSynthetic(t *testing.T) {
	b := make([]byte, endKnown)
	ne := binary.NativeEndian
	b[offState], b[offCAState], b[offRetransmits], b[offProbes], b[offBackoff], b[offOptions] = 1, 3, 2, 4, 5, 7
	b[offWscale] = 0x7 | 0x9<<4
	b[offAppLimited] = 1
	v := uint32(1000)
	for off := offRTO; off < offPacingRate; off += 4 {
		ne.PutUint32(b[off:], v+uint32(off))
	}
	for _, off := range []int{offPacingRate, offMaxPacingRate, offBytesAcked, offBytesReceived, offDeliveryRate,
		offBusyTime, offRwndLimited, offSndbufLimited, offBytesSent, offBytesRetrans} {
		ne.PutUint64(b[off:], 1<<40+uint64(off))
	}
	for _, off := range []int{offSegsOut, offSegsIn, offNotsentBytes, offMinRTT, offDataSegsIn, offDataSegsOut,
		offDelivered, offDeliveredCE, offDSACKDups, offReordSeen, offRcvOOOPack, offSndWnd, offRcvWnd, offRehash, offTotalRTOTime} {
		ne.PutUint32(b[off:], v+uint32(off))
	}
	ne.PutUint16(b[offTotalRTO:], 11)
	ne.PutUint16(b[offTotalRTORecoveries:], 12)

	var in Info
	if err := Decode(b, &in); err != nil {
		t.Fatal(err)
	}
	u := func(off int) uint32 { return v + uint32(off) }
	us := func(off int) time.Duration { return time.Duration(u(off)) * time.Microsecond }
	ms := func(off int) time.Duration { return time.Duration(u(off)) * time.Millisecond }
	big := func(off int) uint64 { return 1<<40 + uint64(off) }
	check := func(name string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("Len", in.Len, endKnown)
	check("State", in.State, uint8(1))
	check("CAState", in.CAState, uint8(CARecovery))
	check("Retransmits", in.Retransmits, uint8(2))
	check("Probes", in.Probes, uint8(4))
	check("Backoff", in.Backoff, uint8(5))
	check("Options", in.Options, uint8(7))
	check("SndWscale", in.SndWscale, uint8(7))
	check("RcvWscale", in.RcvWscale, uint8(9))
	check("DeliveryRateAppLimited", in.DeliveryRateAppLimited, true)
	check("RTO", in.RTO, us(offRTO))
	check("ATO", in.ATO, us(offATO))
	check("SndMSS", in.SndMSS, u(offSndMSS))
	check("RcvMSS", in.RcvMSS, u(offRcvMSS))
	check("Unacked", in.Unacked, u(offUnacked))
	check("Sacked", in.Sacked, u(offSacked))
	check("Lost", in.Lost, u(offLost))
	check("Retrans", in.Retrans, u(offRetrans))
	check("Fackets", in.Fackets, u(offFackets))
	check("LastDataSent", in.LastDataSent, ms(offLastDataSent))
	check("LastAckSent", in.LastAckSent, ms(offLastAckSent))
	check("LastDataRecv", in.LastDataRecv, ms(offLastDataRecv))
	check("LastAckRecv", in.LastAckRecv, ms(offLastAckRecv))
	check("PMTU", in.PMTU, u(offPMTU))
	check("RcvSsthresh", in.RcvSsthresh, u(offRcvSsthresh))
	check("RTT", in.RTT, us(offRTT))
	check("RTTVar", in.RTTVar, us(offRTTVar))
	check("SndSsthresh", in.SndSsthresh, u(offSndSsthresh))
	check("SndCwnd", in.SndCwnd, u(offSndCwnd))
	check("AdvMSS", in.AdvMSS, u(offAdvMSS))
	check("Reordering", in.Reordering, u(offReordering))
	check("RcvRTT", in.RcvRTT, us(offRcvRTT))
	check("RcvSpace", in.RcvSpace, u(offRcvSpace))
	check("TotalRetrans", in.TotalRetrans, u(offTotalRetrans))
	check("PacingRate", in.PacingRate, big(offPacingRate))
	check("MaxPacingRate", in.MaxPacingRate, big(offMaxPacingRate))
	check("BytesAcked", in.BytesAcked, big(offBytesAcked))
	check("BytesReceived", in.BytesReceived, big(offBytesReceived))
	check("SegsOut", in.SegsOut, u(offSegsOut))
	check("SegsIn", in.SegsIn, u(offSegsIn))
	check("NotsentBytes", in.NotsentBytes, u(offNotsentBytes))
	check("MinRTT", in.MinRTT, us(offMinRTT))
	check("DataSegsIn", in.DataSegsIn, u(offDataSegsIn))
	check("DataSegsOut", in.DataSegsOut, u(offDataSegsOut))
	check("DeliveryRate", in.DeliveryRate, big(offDeliveryRate))
	check("BusyTime", in.BusyTime, time.Duration(big(offBusyTime))*time.Microsecond)
	check("RwndLimited", in.RwndLimited, time.Duration(big(offRwndLimited))*time.Microsecond)
	check("SndbufLimited", in.SndbufLimited, time.Duration(big(offSndbufLimited))*time.Microsecond)
	check("Delivered", in.Delivered, u(offDelivered))
	check("DeliveredCE", in.DeliveredCE, u(offDeliveredCE))
	check("BytesSent", in.BytesSent, big(offBytesSent))
	check("BytesRetrans", in.BytesRetrans, big(offBytesRetrans))
	check("DSACKDups", in.DSACKDups, u(offDSACKDups))
	check("ReordSeen", in.ReordSeen, u(offReordSeen))
	check("RcvOOOPack", in.RcvOOOPack, u(offRcvOOOPack))
	check("SndWnd", in.SndWnd, u(offSndWnd))
	check("RcvWnd", in.RcvWnd, u(offRcvWnd))
	check("Rehash", in.Rehash, u(offRehash))
	check("TotalRTO", in.TotalRTO, uint16(11))
	check("TotalRTORecoveries", in.TotalRTORecoveries, uint16(12))
	check("TotalRTOTime", in.TotalRTOTime, ms(offTotalRTOTime))
	for _, f := range []int{FieldBytesAcked, FieldNotsentBytes, FieldBusyTime, FieldBytesSent, FieldSndWnd, FieldTotalRTO} {
		if !in.Has(f) {
			t.Errorf("full struct: Has(%d) = false", f)
		}
	}

	// A 4.9 kernel returns 168 bytes: up to delivery_rate.
	var old Info
	if err := Decode(b[:offBusyTime], &old); err != nil {
		t.Fatal(err)
	}
	check("old DeliveryRate", old.DeliveryRate, big(offDeliveryRate))
	check("old BusyTime", old.BusyTime, time.Duration(0))
	check("old TotalRTO", old.TotalRTO, uint16(0))
	if !old.Has(FieldNotsentBytes) || old.Has(FieldBusyTime) || old.Has(FieldTotalRTO) {
		t.Errorf("168-byte struct: Has wrong")
	}
	// A field cut in the middle is absent, not half-read.
	if err := Decode(b[:offTotalRTO+1], &old); err != nil || old.TotalRTO != 0 || old.Rehash != u(offRehash) {
		t.Errorf("cut struct: TotalRTO %d Rehash %d err %v", old.TotalRTO, old.Rehash, err)
	}
	if err := Decode(b[:offPacingRate-1], &old); err == nil {
		t.Error("Decode of a 103-byte struct succeeded")
	}
}

// TestDecodeMatchesKernel compares our raw read with x/sys's
// GetsockoptTCPInfo on a quiet real socket.
func TestDecodeMatchesKernel(t *testing.T) {
	c := tcpPair(t, "")
	if _, err := c.Write(bytes.Repeat([]byte("x"), 100000)); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, c)
	rc, _ := c.SyscallConn()
	// The peer may still open its window after the last ACK: x/sys's read
	// must fall between two of ours that agree.
	type fields [12]uint64
	mine := func(in Info) fields {
		return fields{uint64(in.State), uint64(in.SndMSS), uint64(in.SndCwnd), uint64(in.SndSsthresh), uint64(in.RTO / time.Microsecond),
			uint64(in.TotalRetrans), in.BytesAcked, in.BytesSent, uint64(in.SegsOut), uint64(in.DataSegsOut), uint64(in.Delivered), uint64(in.SndWnd)}
	}
	names := [12]string{"state", "snd_mss", "snd_cwnd", "snd_ssthresh", "rto", "total_retrans", "bytes_acked", "bytes_sent",
		"segs_out", "data_segs_out", "delivered", "snd_wnd"}
	var ours Info
	var a, b, xs fields
	for try := 0; ; try++ {
		ours = readConn(t, c)
		var x *unix.TCPInfo
		var xerr error
		rc.Control(func(fd uintptr) { x, xerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if xerr != nil {
			t.Fatal(xerr)
		}
		a, b = mine(ours), mine(readConn(t, c))
		xs = fields{uint64(x.State), uint64(x.Snd_mss), uint64(x.Snd_cwnd), uint64(x.Snd_ssthresh), uint64(x.Rto),
			uint64(x.Total_retrans), x.Bytes_acked, x.Bytes_sent, uint64(x.Segs_out), uint64(x.Data_segs_out), uint64(x.Delivered), uint64(x.Snd_wnd)}
		if a == b || try == 50 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ours.Len < endKnown {
		t.Logf("kernel returned %d bytes (older than 6.7): newer fields absent", ours.Len)
	}
	if a != b {
		t.Fatalf("the socket never stayed still for two reads: %v then %v", a, b)
	}
	for i := range names {
		if a[i] != xs[i] {
			t.Errorf("%s: ours %d, x/sys %d", names[i], a[i], xs[i])
		}
	}
	if ours.State != 1 {
		t.Errorf("state %d, want 1 (established)", ours.State)
	}
	// 100000 bytes plus nothing else: bytes_acked counts the SYN's byte.
	if ours.BytesAcked != 100001 || ours.BytesSent != 100000 {
		t.Errorf("bytes_acked %d (want 100001), bytes_sent %d (want 100000)", ours.BytesAcked, ours.BytesSent)
	}
}

// TestAgainstSS checks decoded values against ss(8), which reads them via
// netlink (INET_DIAG_INFO): an independent decoder of the same kernel data.
func TestAgainstSS(t *testing.T) {
	ssPath, err := exec.LookPath("ss")
	if err != nil {
		t.Skip("ss not installed")
	}
	c := tcpPair(t, "cubic")
	if _, err := c.Write(make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	in := waitAcked(t, c)
	port := c.LocalAddr().(*net.TCPAddr).Port
	out, err := exec.Command(ssPath, "-tinH", "src", "127.0.0.1:"+strconv.Itoa(port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	in2 := readConn(t, c)
	field := func(name string) int64 {
		m := regexp.MustCompile(`\b` + name + `:(\d+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("ss output has no %s:\n%s", name, out)
		}
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		return n
	}
	eq := func(name string, ss int64, a, b uint64) {
		t.Helper()
		if uint64(ss) != a && uint64(ss) != b {
			t.Errorf("%s: ss says %d, we read %d / %d", name, ss, a, b)
		}
	}
	eq("cwnd", field("cwnd"), uint64(in.SndCwnd), uint64(in2.SndCwnd))
	eq("mss", field("mss"), uint64(in.SndMSS), uint64(in2.SndMSS))
	eq("bytes_acked", field("bytes_acked"), in.BytesAcked, in2.BytesAcked)
	eq("bytes_sent", field("bytes_sent"), in.BytesSent, in2.BytesSent)
	eq("segs_out", field("segs_out"), uint64(in.SegsOut), uint64(in2.SegsOut))
	eq("rto (ms)", field("rto"), uint64(in.RTO/time.Millisecond), uint64(in2.RTO/time.Millisecond))
	if in.SndSsthresh != InfiniteSsthresh {
		eq("ssthresh", field("ssthresh"), uint64(in.SndSsthresh), uint64(in2.SndSsthresh))
	}
	// ss prints retrans:<current>/<total> only when there were any.
	ssRetrans := int64(0)
	if m := regexp.MustCompile(`\bretrans:\d+/(\d+)`).FindSubmatch(out); m != nil {
		ssRetrans, _ = strconv.ParseInt(string(m[1]), 10, 64)
	}
	eq("total_retrans", ssRetrans, uint64(in.TotalRetrans), uint64(in2.TotalRetrans))
}

func TestLoopbackCounters(t *testing.T) {
	c := tcpPair(t, "")
	var tr Tracker
	var ev []Event
	first := readConn(t, c)
	ev = tr.Update(time.Now(), &first, ev[:0])
	buf := make([]byte, 1<<20)
	prevAcked := first.BytesAcked
	for i := range 3 {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		in := waitAcked(t, c)
		ev = tr.Update(time.Now(), &in, ev[:0])
		if in.BytesAcked < prevAcked+uint64(len(buf)) {
			t.Errorf("round %d: bytes_acked %d did not grow by %d from %d", i, in.BytesAcked, len(buf), prevAcked)
		}
		prevAcked = in.BytesAcked
		// Loopback loses nothing. A receiver starved of CPU (2 shared
		// cores, -race) can delay ACKs enough for a tail loss probe; the
		// peer then reports it as a duplicate (D-SACK): still no loss.
		if in.Lost != 0 || in.TotalRetrans > in.DSACKDups {
			t.Errorf("retransmissions on loopback not explained by spurious ones: retrans %d dsack %d lost %d",
				in.TotalRetrans, in.DSACKDups, in.Lost)
		}
		if in.TotalRetrans != 0 {
			t.Logf("round %d: %d spurious retransmissions (D-SACK %d)", i, in.TotalRetrans, in.DSACKDups)
		}
		if in.RTT <= 0 || in.RTT > 100*time.Millisecond || in.SndCwnd < 10 || in.SndMSS == 0 {
			t.Errorf("implausible rtt %v cwnd %d mss %d", in.RTT, in.SndCwnd, in.SndMSS)
		}
		for _, e := range ev {
			switch e.Kind {
			case RetransRTO, RTO, Lost, IdleRestart: // a spurious TLP shows as RetransFast, checked above
				t.Errorf("unexpected event on a busy loopback connection: %v", e)
			}
		}
	}
	cn := tr.C
	if cn.Samples != 4 || cn.BytesAcked != prevAcked || cn.RTOs != 0 || cn.Lost != 0 {
		t.Errorf("counters %+v", cn)
	}
	if cn.RTTMean() <= 0 {
		t.Errorf("RTT mean %v", cn.RTTMean())
	}
	if cn.BusyTime < cn.RwndLimited+cn.SndbufLimited {
		t.Errorf("busy %v < rwnd %v + sndbuf %v", cn.BusyTime, cn.RwndLimited, cn.SndbufLimited)
	}
	r, s, w := cn.Fractions()
	if r < 0 || s < 0 || w < 0 || r+s+w > 1.0001 {
		t.Errorf("fractions %v %v %v", r, s, w)
	}
	t.Logf("3 MiB over loopback: rtt %v (mean %v sd %v), cwnd max %d, busy %v rwnd-limited %v sndbuf-limited %v, delivery rate %.0f MB/s",
		first.RTT, cn.RTTMean(), cn.RTTStdDev(), cn.MaxCwnd, cn.BusyTime, cn.RwndLimited, cn.SndbufLimited, float64(cn.DeliveryRate)/1e6)
}

// growCwnd writes bursts until cwnd is well above the initial window.
func growCwnd(t *testing.T, c *net.TCPConn) Info {
	t.Helper()
	buf := make([]byte, 8<<20)
	for range 8 {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if in := readConn(t, c); in.SndCwnd >= 20 {
			break
		}
	}
	in := waitAcked(t, c)
	if in.SndCwnd < 16 {
		t.Skipf("cwnd only reached %d on loopback; cannot see a restart", in.SndCwnd)
	}
	return in
}

// TestIdleRestart: with tcp_slow_start_after_idle=1 (the default) a
// loss-based congestion control collapses cwnd to the initial window when
// data is sent after more than an RTO of silence, and the Tracker says so.
func TestIdleRestart(t *testing.T) {
	if b, err := readSysctl("net/ipv4/tcp_slow_start_after_idle"); err != nil || b != "1" {
		t.Skipf("tcp_slow_start_after_idle = %q (%v): the kernel will not restart", b, err)
	}
	for _, sampleDuringIdle := range []bool{false, true} {
		c := tcpPair(t, "cubic")
		var tr Tracker
		in := growCwnd(t, c)
		tr.Update(time.Now(), &in, nil)
		idle := in.RTO + 150*time.Millisecond
		time.Sleep(idle)
		if sampleDuringIdle {
			mid := readConn(t, c)
			if ev := tr.Update(time.Now(), &mid, nil); len(ev) != 0 {
				t.Errorf("events while idle: %v", ev)
			}
		}
		if _, err := c.Write([]byte("wake up")); err != nil {
			t.Fatal(err)
		}
		after := readConn(t, c)
		ev := tr.Update(time.Now(), &after, nil)
		var got *Event
		for i := range ev {
			if ev[i].Kind == IdleRestart {
				got = &ev[i]
			}
		}
		if got == nil {
			t.Fatalf("no idle restart detected (cwnd %d -> %d, events %v)", in.SndCwnd, after.SndCwnd, ev)
		}
		// Linux halves cwnd once per RTO of idleness, down to 10 segments;
		// the wake-up write may grow it back by a segment. The Tracker
		// derives the idle time from tcpi_last_data_sent, kept in jiffies
		// and read twice, so it may come out up to two ticks (8 ms at
		// HZ=250) shorter than the sleep; allow 10 ms.
		const lastSentResolution = 10 * time.Millisecond
		if want := max(in.SndCwnd/2, 10) + 1; got.From != in.SndCwnd || got.To != after.SndCwnd || got.To > want || got.Idle < idle-lastSentResolution {
			t.Errorf("restart event %v: want cwnd %d -> <= %d after >= %v", got, in.SndCwnd, want, idle-lastSentResolution)
		}
		if tr.C.IdleRestarts != 1 || tr.C.RetransFast+tr.C.RetransRTO != 0 {
			t.Errorf("counters %+v", tr.C)
		}
		t.Logf("sample during idle %v: %v", sampleDuringIdle, got)
	}
}

// TestNoRestartWithoutIdle: the same sequence with a pause shorter than the
// RTO must not be reported, nor one with BBR (no restart in Linux).
func TestNoRestartWithoutIdle(t *testing.T) {
	for _, tc := range []struct {
		cc    string
		pause func(rto time.Duration) time.Duration
	}{
		{"cubic", func(rto time.Duration) time.Duration { return rto / 4 }},
		{"bbr", func(rto time.Duration) time.Duration { return rto + 150*time.Millisecond }},
	} {
		c := tcpPair(t, tc.cc)
		tr := Tracker{CongestionControl: tc.cc}
		in := growCwnd(t, c)
		tr.Update(time.Now(), &in, nil)
		time.Sleep(tc.pause(in.RTO))
		if _, err := c.Write([]byte("again")); err != nil {
			t.Fatal(err)
		}
		after := readConn(t, c)
		for _, e := range tr.Update(time.Now(), &after, nil) {
			if e.Kind == IdleRestart {
				t.Errorf("%s, pause %v: false idle restart %v", tc.cc, tc.pause(in.RTO), e)
			}
		}
	}
}

func readSysctl(name string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + name)
	return string(bytes.TrimSpace(b)), err
}
