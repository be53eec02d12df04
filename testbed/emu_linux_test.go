package testbed

import (
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLinkPipeline runs the real reader and writer threads of one link over
// datagram socket pairs instead of TUN devices (no root needed): a burst
// larger than the queue is shaped to the rate, the excess is dropped
// drop-tail, and everything accepted arrives after the delay, in order,
// counted per flow.
func TestLinkPipeline(t *testing.T) {
	in, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = unix.Shutdown(in[1], unix.SHUT_RDWR) // ends the reader
		for _, fd := range []int{in[0], out[1]} {
			unix.Close(fd)
		}
	}()
	for _, fd := range []int{in[0], in[1], out[0], out[1]} {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// As in the daemon: a P for each locked thread (see RunEmulator).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	// 80 Mbit/s: a 1000-byte packet takes 100 us. Queue 20 packets.
	p := &emuParams{rate: 80e6, queue: 20000}
	const delay = 5 * time.Millisecond
	p.oneway.Store(int64(delay))
	clk := newClock()
	l, err := newLink("a", "b", in[1], out[0], p, 1500, clk, 42)
	if err != nil {
		t.Fatal(err)
	}
	// The whole burst waits in the socket before the reader starts, so it
	// arrives at once however slowly this goroutine runs.
	const burst = 60
	start := time.Now()
	for i := 0; i < burst; i++ { // 60 x 1000 B: 4.8 ms at the link rate
		if _, err := unix.Write(in[0], udpPacket(1000, uint16(1000+i))); err != nil {
			t.Fatal(err)
		}
	}
	go l.reader()
	go l.writer(l.main)
	buf := make([]byte, 2000)
	var arrivals []time.Duration
	var ports []int
	_ = unix.SetsockoptTimeval(out[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 0, Usec: 300000})
	for {
		n, err := unix.Read(out[1], buf)
		if err != nil {
			// A quiet 300 ms ends the burst only once the link has accounted
			// for every packet: on 2 busy cores (packages test in parallel)
			// the writer goroutine can be starved longer than that.
			if st := l.stats(); st.DeliveredPackets+st.QueueDrops < burst && time.Since(start) < 20*time.Second {
				continue
			}
			break
		}
		if n != 1000 {
			t.Fatalf("delivered a %d-byte packet, sent 1000", n)
		}
		arrivals = append(arrivals, time.Since(start))
		ports = append(ports, int(buf[20])<<8|int(buf[21]))
	}
	s := l.stats()
	t.Logf("accepted %d of %d, queue drops %d, first %v last %v", len(arrivals), burst, s.QueueDrops, arrivals[0], arrivals[len(arrivals)-1])
	if s.Packets != burst || s.Bytes != burst*1000 {
		t.Errorf("link saw %d packets / %d bytes, want %d / %d", s.Packets, s.Bytes, burst, burst*1000)
	}
	if uint64(len(arrivals))+s.QueueDrops != burst || s.DeliveredPackets != uint64(len(arrivals)) {
		t.Errorf("delivered %d + dropped %d != %d (stats delivered %d)", len(arrivals), s.QueueDrops, burst, s.DeliveredPackets)
	}
	// How many of the burst get in depends on how fast the reader goroutine
	// drains the socket, which a busy machine slows (TestShaperRateAndQueue
	// checks the queue's arithmetic on a synthetic clock). What holds on any
	// machine: at least the queue's 20 get in, no packet waits longer than
	// the queue holds, and a drop happens only against a full queue.
	if len(arrivals) < 20 {
		t.Errorf("%d packets accepted from a burst of %d into a 20-packet queue", len(arrivals), burst)
	}
	full := 19 * 100 * time.Microsecond // 19 packets ahead of the next
	// (The histogram's buckets are 1/16 of an octave wide.)
	if s.QueueDelay.Max > (full+100*time.Microsecond)*17/16 {
		t.Errorf("a packet waited %v in a queue that holds %v", s.QueueDelay.Max, full)
	}
	if s.QueueDrops > 0 && s.QueueDelay.Max < full-200*time.Microsecond {
		t.Errorf("%d queue drops, yet the longest wait was %v, short of a full queue's %v", s.QueueDrops, s.QueueDelay.Max, full)
	}
	for i := 1; i < len(ports); i++ {
		if ports[i] <= ports[i-1] {
			t.Fatalf("reordered: port %d after %d", ports[i], ports[i-1])
		}
	}
	// Never early: packet i cannot arrive before the delay plus i+1
	// serializations. (Upper bounds depend on how busy the machine is: the
	// emulator's own lateness is in s.Late, logged here.)
	for i, a := range arrivals {
		if min := delay + time.Duration(i+1)*100*time.Microsecond; a < min {
			t.Errorf("packet %d arrived after %v, before delay+serialization %v", i, a, min)
		}
	}
	t.Logf("emulator lateness: p50 %v p99 %v max %v", s.Late.P50, s.Late.P99, s.Late.Max)
	if len(s.Flows) != burst {
		t.Errorf("%d flows, want %d (one per source port)", len(s.Flows), burst)
	}
	if f := s.Flow("udp", "10.77.1.11:1000", "10.77.2.11:7000"); f == nil || f.Packets != 1 || f.Bytes != 1000 {
		t.Errorf("flow of port 1000: %+v", f)
	}

	// Random loss: 30 % of 2000 small packets, far below the rate.
	p.loss.Store(math.Float64bits(0.3))
	before := l.stats().RandomDrops
	for i := 0; i < 2000; i++ {
		if _, err := unix.Write(in[0], udpPacket(60, 9)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond)
	drops := l.stats().RandomDrops - before
	if drops < 520 || drops > 680 {
		t.Errorf("%d random drops of 2000 at 30%% loss", drops)
	}
}

// BenchmarkLinkPipeline measures the emulator's own cost per packet
// (read, parse, flow accounting, shaping, ring handoff, write) over
// socket pairs, without the kernel forwarding a TUN write triggers in the
// lab. Unlimited rate, no delay, 1000-byte UDP packets.
func BenchmarkLinkPipeline(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	in, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	out, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	defer func() {
		_ = unix.Shutdown(in[1], unix.SHUT_RDWR)
		unix.Close(in[0])
		unix.Close(out[1])
	}()
	p := &emuParams{queue: 1 << 20}
	l, err := newLink("a", "b", in[1], out[0], p, 1500, newClock(), 1)
	if err != nil {
		b.Fatal(err)
	}
	go l.reader()
	go l.writer(l.main)
	pk := udpPacket(1000, 5)
	done := make(chan struct{})
	_ = unix.SetsockoptTimeval(out[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1})
	received := 0
	go func() {
		buf := make([]byte, 2000)
		for received < b.N {
			if _, err := unix.Read(out[1], buf); err != nil {
				break // a timeout: the rest was dropped (buffers exhausted)
			}
			received++
		}
		close(done)
	}()
	b.SetBytes(1000)
	var ru0, ru1 unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := unix.Write(in[0], pk); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pkt/s")
	if received != b.N {
		st := l.stats()
		b.Fatalf("received %d of %d packets (link: %d in, %d delivered, %d queue drops)", received, b.N, st.Packets, st.DeliveredPackets, st.QueueDrops)
	}
	// CPU of the whole process per packet (emulator threads plus this
	// benchmark's sender and receiver: four socket syscalls per packet): a
	// figure that a busy machine inflates less than wall-clock time.
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() - ru0.Utime.Nano() + ru1.Stime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/pkt")
}

// reorderRun sends count 1000-byte packets (source port = sequence number)
// through a link that holds frac of them back by extra, and returns each
// packet's arrival time (indexed by sequence number, -1 if it never came),
// the sequence numbers in arrival order and the link's stats.
func reorderRun(t *testing.T, seed uint64, count int, frac float64, extra time.Duration) ([]time.Duration, []int, LinkStats) {
	t.Helper()
	in, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = unix.Shutdown(in[1], unix.SHUT_RDWR)
		for _, fd := range []int{in[0], out[1]} {
			unix.Close(fd)
		}
	}()
	for _, fd := range []int{in[0], in[1], out[0], out[1]} {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// 80 Mbit/s: one packet every 100 us, so extra lets extra/100us
	// later packets overtake a held one. The queue holds the whole burst.
	p := &emuParams{rate: 80e6, queue: count * 1000}
	p.oneway.Store(int64(2 * time.Millisecond))
	p.reorder.Store(math.Float64bits(frac))
	p.reorderDelay.Store(int64(extra))
	l, err := newLink("a", "b", in[1], out[0], p, 1500, newClock(), seed)
	if err != nil {
		t.Fatal(err)
	}
	go l.reader()
	go l.writer(l.main)
	_ = unix.SetsockoptTimeval(out[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 0, Usec: 300000})
	buf := make([]byte, 2000)
	// One packet first, with reordering off, so both threads run before
	// the burst: a writer still starting would delay every packet alike
	// and hide the held ones' extra delay.
	p.reorder.Store(0)
	if _, err := unix.Write(in[0], udpPacket(1000, 999)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Read(out[1], buf); err != nil {
		t.Fatalf("warm-up packet: %v", err)
	}
	p.reorder.Store(math.Float64bits(frac))
	// Sent from another goroutine: arrivals are timed as they come, not
	// after a slow (race-instrumented, loaded) sending loop.
	start := time.Now()
	go func() {
		for i := 0; i < count; i++ {
			_, _ = unix.Write(in[0], udpPacket(1000, uint16(1000+i)))
		}
	}()
	at := make([]time.Duration, count)
	for i := range at {
		at[i] = -1
	}
	var order []int
	for len(order) < count && time.Since(start) < 20*time.Second {
		n, err := unix.Read(out[1], buf)
		if err != nil {
			continue // a busy machine: the writers may be late
		}
		if n != 1000 {
			t.Fatalf("delivered a %d-byte packet, sent 1000", n)
		}
		seq := int(buf[20])<<8 | int(buf[21]) - 1000
		if seq < 0 || seq >= count {
			t.Fatalf("packet %d was never sent", seq)
		}
		if at[seq] >= 0 {
			t.Fatalf("packet %d arrived twice", seq)
		}
		at[seq] = time.Since(start)
		order = append(order, seq)
	}
	return at, order, l.stats()
}

// TestLinkReorder: with reordering on, every packet still arrives exactly
// once (reorderRun fails on a duplicate); the held-back fraction is near the
// one set; held packets, and only they, are overtaken by later ones.
func TestLinkReorder(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	const count = 400
	const extra = 30 * time.Millisecond
	_, order, s := reorderRun(t, 7, count, 0.1, extra)
	if len(order) != count {
		t.Fatalf("%d of %d packets arrived", len(order), count)
	}
	// Overtaken: arrived after a packet sent later. Held packets keep
	// their order among themselves, and every packet sent within 30 ms
	// after one (300 of them at the link's rate) overtakes it, so each
	// held packet but the last few of the burst is overtaken and no other
	// is, unless a writer thread was starved of CPU for ~30 ms.
	overtaken, highest := 0, -1
	for _, q := range order {
		if q < highest {
			overtaken++
		}
		highest = max(highest, q)
	}
	t.Logf("%d of %d held back, %d overtaken", s.Held, count, overtaken)
	// Binomial(400, 0.1): mean 40, sd 6.
	if s.Held < 20 || s.Held > 60 {
		t.Errorf("link held %d of %d packets back at 10%%", s.Held, count)
	}
	if uint64(overtaken) > s.Held || uint64(overtaken) < s.Held*3/4 {
		t.Errorf("%d packets overtaken, the link held %d back", overtaken, s.Held)
	}
	if _, order0, s0 := reorderRun(t, 7, 100, 0, 0); s0.Held != 0 || !slices.IsSorted(order0) {
		t.Errorf("reorder 0: %d packets held back, arrival order %v", s0.Held, order0)
	}
}

// TestLinkChoicesSeeded: a link's loss and hold-back choices are a function
// of the seed and the packet sequence: the same seed repeats them, another
// seed does not, and each fraction is near the one set.
func TestLinkChoicesSeeded(t *testing.T) {
	choices := func(seed uint64) (string, int, int) {
		p := &emuParams{}
		p.loss.Store(math.Float64bits(0.01))
		p.reorder.Store(math.Float64bits(0.05))
		l := &link{params: p, rng: seed*7 + 1}
		b := make([]byte, 20000)
		lost, held := 0, 0
		for i := range b {
			switch {
			case l.lose():
				b[i] = 'L'
				lost++
			case l.hold():
				b[i] = 'H'
				held++
			default:
				b[i] = '.'
			}
		}
		return string(b), lost, held
	}
	a, lost, held := choices(1)
	b, _, _ := choices(1)
	c, _, _ := choices(2)
	if a != b {
		t.Error("seed 1 made different choices twice")
	}
	if a == c {
		t.Error("seeds 1 and 2 made the same choices")
	}
	// 20000 packets: 1 % lost (sd 14), 5 % of the rest held (sd 31).
	if lost < 140 || lost > 260 || held < 850 || held > 1130 {
		t.Errorf("%d lost at 1%%, %d held at 5%% of 20000", lost, held)
	}
}

// TestLinkStripsEthernet: a LAN lane gets frames with their Ethernet
// header (nftables' fwd) and delivers the IPv4 packet alone, whatever the
// destination MAC starts with (0x4e looks like an IPv4 version nibble).
func TestLinkStripsEthernet(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	in, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = unix.Shutdown(in[1], unix.SHUT_RDWR)
		unix.Close(in[0])
		unix.Close(out[1])
	}()
	p := &emuParams{queue: 1 << 20}
	p.oneway.Store(int64(time.Millisecond))
	l, err := newLink("a", "a-lan", in[1], out[0], p, 1514, newClock(), 3)
	if err != nil {
		t.Fatal(err)
	}
	l.strip = true
	go l.reader()
	go l.writer(l.main)
	_ = unix.SetsockoptTimeval(out[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	buf := make([]byte, 2000)
	for _, mac0 := range []byte{0x4e, 0x02, 0x46} {
		ip := udpPacket(100, 4242)
		eth := append([]byte{mac0, 1, 2, 3, 4, 5, 0x02, 9, 9, 9, 9, 9, 0x08, 0x00}, ip...)
		if _, err := unix.Write(in[0], eth); err != nil {
			t.Fatal(err)
		}
		n, err := unix.Read(out[1], buf)
		if err != nil {
			t.Fatalf("MAC %#x: %v", mac0, err)
		}
		if !slices.Equal(buf[:n], ip) {
			t.Errorf("MAC %#x: delivered % x, want the IPv4 packet % x", mac0, buf[:min(n, 24)], ip[:24])
		}
	}
	st := l.stats()
	if f := st.Flow("udp", "", ""); f == nil || f.Packets != 3 {
		t.Errorf("the stripped packets were not parsed as one UDP flow: %+v", st.Flows)
	}
}
