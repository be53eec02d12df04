package relay

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"golang.org/x/sys/unix"
)

// TestPollerForwards: in a ping-pong of small messages the poller thread
// does the forwarding on both gateways (it reads the quiet application's
// socket and the idle link), and Config.NoPoller turns it off.
func TestPollerForwards(t *testing.T) {
	const rounds = 200
	dst := testnet.Echo(t, loopback)
	for _, off := range []bool{false, true} {
		a, b := pair(t, Config{NoPoller: off})
		app, _ := openVia(t, a, dst)
		msg := make([]byte, 100)
		for i := range rounds {
			msg[0] = byte(i)
			if _, err := app.Write(msg); err != nil {
				t.Fatal(err)
			}
			app.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		app.Close()
		polled := []uint64{a.Stats.PollSent.Load(), a.Stats.PollRecv.Load(), b.Stats.PollSent.Load(), b.Stats.PollRecv.Load()}
		t.Logf("NoPoller=%v: frames sent/received by the poller thread: a %d/%d, b %d/%d", off, polled[0], polled[1], polled[2], polled[3])
		for _, n := range polled {
			if off && n != 0 {
				t.Fatalf("NoPoller: the poller thread handled %d frames", n)
			}
			// Under -race a message may arrive before its reader waits; most must not.
			if !off && n < rounds/2 {
				t.Fatalf("the poller thread handled %d frames of %d rounds", n, rounds)
			}
		}
	}
}

// TestPollerPartialWrite: frames the poller thread writes while the link's
// socket is full go out whole and in order; the writer sends what the
// socket did not take.
func TestPollerPartialWrite(t *testing.T) {
	cfg := Config{PingInterval: time.Hour}
	ca, cb, ha, _ := handshaken(t, &cfg, 0, 1, 0)
	TCPOf(ca).SetWriteBuffer(4096)
	TCPOf(cb).SetReadBuffer(4096)
	l := NewLink(ca, cfg, ha, true, nil)
	t.Cleanup(func() { l.Close(); cb.Close() })
	if l.w == nil {
		t.Skip("no poller on this system")
	}
	const n = 3000
	done := make(chan struct{})
	go func() { // the far end reads nothing for a while: the socket fills
		defer close(done)
		for i := range n {
			f := frame{h: header.Header{Type: header.TypeWindow, Stream: uint32(i + 1), Length: 4}}
			header.PutU32(f.ctl[:4], uint32(i))
			if !l.send(f, nil, sendTry) {
				t.Errorf("send %d failed", i)
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	r := header.NewReader(cb, 0)
	cb.SetReadDeadline(time.Now().Add(20 * time.Second))
	for i := range n {
		h, p, err := r.ReadFrame(make([]byte, 8))
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if v, _ := header.DecodeWindow(p); h.Type != header.TypeWindow || h.Stream != uint32(i+1) || v != uint32(i) {
			t.Fatalf("frame %d: %v stream %d window %d", i, h.Type, h.Stream, v)
		}
	}
	<-done
	if l.Stats.PollPartial.Load() == 0 {
		t.Fatal("the socket never refused part of a frame: the test did not test")
	}
	t.Logf("%d of %d frames only partly taken by the socket", l.Stats.PollPartial.Load(), l.Stats.PollSent.Load())
}

// TestPollerCorks: when the poller thread finds several streams' messages
// readable at once, it writes their frames to the idle link together
// (fewer writes than frames), and every message still arrives whole and
// in its stream's order, also when the link's socket takes only part of
// a corked batch (a small send buffer, 4000-byte messages).
func TestPollerCorks(t *testing.T) {
	for _, size := range []int{200, 4000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) { testPollerCorks(t, size) })
	}
}

func testPollerCorks(t *testing.T, size int) {
	const streams, rounds = 16, 100
	dst := testnet.Echo(t, loopback)
	a, _ := pair(t, Config{})
	if a.w == nil {
		t.Skip("no poller on this system")
	}
	if size > 1000 {
		TCPOf(a.conn).SetWriteBuffer(8192) // below a batch of 16 frames
	}
	apps := make([]*net.TCPConn, streams)
	for i := range apps {
		apps[i], _ = openVia(t, a, dst)
		defer apps[i].Close()
	}
	msg, got := make([]byte, size), make([]byte, size)
	sent0, writes0 := a.Stats.PollSent.Load(), a.Stats.Writes.Load()
	for r := range rounds {
		for i, app := range apps {
			msg[0], msg[1], msg[size-1] = byte(r), byte(i), byte(r+i)
			if _, err := app.Write(msg); err != nil {
				t.Fatal(err)
			}
		}
		for i, app := range apps {
			msg[0], msg[1], msg[size-1] = byte(r), byte(i), byte(r+i)
			app.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("round %d, stream %d: %v (% x)", r, i, err, got[:2])
			}
		}
	}
	sent, writes := a.Stats.PollSent.Load()-sent0, a.Stats.Writes.Load()-writes0
	t.Logf("frames sent by the poller thread %d, writes to the link %d, partly taken %d", sent, writes, a.Stats.PollPartial.Load())
	// Without corking each frame the poller sends is a write of its own.
	if size < 1000 && writes >= sent {
		t.Fatalf("%d writes for %d frames from the poller thread: nothing was corked", writes, sent)
	}
}

// TestAppendIOVSkip: a frame less its first k bytes, for every k.
func TestAppendIOVSkip(t *testing.T) {
	f := frame{h: header.Header{Type: header.TypeDataAt, Stream: 3, Length: header.DataAtPrefix + 5}, body: []byte("hello")}
	header.PutU32(f.ctl[:4], 77)
	var hb [header.Size]byte
	whole := bytes.Join(f.appendIOV(nil, hb[:]), nil)
	if len(whole) != f.wireLen() {
		t.Fatalf("frame is %d bytes, wireLen %d", len(whole), f.wireLen())
	}
	for k := range f.wireLen() + 1 {
		g := f
		g.skip = k
		if got := bytes.Join(g.appendIOV(nil, hb[:]), nil); !bytes.Equal(got, whole[k:]) {
			t.Fatalf("skip %d: % x, want % x", k, got, whole[k:])
		}
	}
}

// TestPollerQuietsRuntime: while the poller thread owns a socket the
// runtime's registration leaves out input, and after the hand-back it is
// as before: a goroutine reading in Go's poller wakes for bytes sent later,
// and a writer parked on a full socket while the poller owns the read side
// wakes when the far end drains it.
func TestPollerQuietsRuntime(t *testing.T) {
	accepted := make(chan *net.TCPConn, 1)
	addr := testnet.Serve(t, loopback, func(c *net.TCPConn) { accepted <- c })
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	far := <-accepted
	defer c.Close()
	defer far.Close()
	// A stage whose first step arms the socket; the poller's step reads
	// it and hands the socket back to a goroutine, which makes it loud.
	got := make(chan []byte, 1)
	waited, back := make(chan bool, 1), make(chan struct{})
	var g stage
	var w *waiter
	first := true
	g.step = func(onPoller bool) waitOn {
		if !onPoller {
			if first {
				first = false
				waited <- w.arm()
				return onReadable
			}
			w.loud()
			close(back)
			return finished
		}
		b := make([]byte, 16)
		n, err := w.read(b)
		if err == errWouldBlock {
			return onReadable
		}
		got <- b[:n]
		return onGoroutine
	}
	w = newWaiter(c, &g, true)
	if w == nil {
		t.Skip("no poller on this system")
	}
	defer w.close()
	rc, _ := c.SyscallConn()
	var fd int
	rc.Control(func(f uintptr) { fd = int(f) })
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	ep, before, ok := runtimeRegistration(w.p, fd)
	if !ok {
		t.Fatal("the runtime's registration of the socket was not found")
	}
	if before.Events&rtInput != unix.EPOLLIN|unix.EPOLLRDHUP {
		t.Fatalf("runtime registration events %#x", before.Events)
	}
	events := func() uint32 { // as the kernel holds it now
		b, err := readAll(fmt.Sprintf("/proc/self/fdinfo/%d", ep), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if f, ev, _, ino, ok := parseEpollEntry(line); ok && f == fd && ino == st.Ino {
				return ev
			}
		}
		t.Fatal("registration gone")
		return 0
	}

	// A writer fills the socket and parks in the runtime while the poller
	// owns the read side.
	c.SetWriteBuffer(64 << 10)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 32<<20))
		wrote <- err
	}()
	g.kick()
	deadline := time.Now().Add(5 * time.Second)
	for events()&rtInput != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("runtime registration not quieted: %#x", events())
		}
		time.Sleep(time.Millisecond)
	}
	if ev := events(); ev != before.Events&^rtInput {
		t.Fatalf("quieted registration %#x, want %#x", ev, before.Events&^rtInput)
	}
	var drained atomic.Int64
	go func() { // drains: the writer must wake
		b := make([]byte, 64<<10)
		for drained.Load() < 32<<20 {
			n, err := far.Read(b)
			drained.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a writer parked in the runtime did not wake while the poller owned the socket (far end read %d bytes)", drained.Load())
	}

	far.Write([]byte("to the poller"))
	if b := <-got; string(b) != "to the poller" {
		t.Fatalf("poller read %q", b)
	}
	if !<-waited {
		t.Fatal("the stage did not arm")
	}
	<-back
	if ev := events(); ev != before.Events {
		t.Fatalf("after the hand-back the registration is %#x, want %#x", ev, before.Events)
	}
	// Go's poller wakes its reader again.
	go func() {
		time.Sleep(100 * time.Millisecond)
		far.Write([]byte("to Go"))
	}()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 16)
	n, err := c.Read(b)
	if err != nil || string(b[:n]) != "to Go" {
		t.Fatalf("Go's reader after the hand-back: %q %v", b[:n], err)
	}
}

// TestParseEpollEntry: the fdinfo lines of an epoll descriptor, as
// fs/eventpoll.c prints them.
func TestParseEpollEntry(t *testing.T) {
	fd, ev, data, ino, ok := parseEpollEntry([]byte("tfd:       12 events: 8000201d data: 3f8040a632000002  pos:0 ino:40763 sdev:9"))
	if !ok || fd != 12 || ev != 0x8000201d || data != 0x3f8040a632000002 || ino != 0x40763 {
		t.Fatalf("got %d %#x %#x %#x %v", fd, ev, data, ino, ok)
	}
	for _, bad := range []string{"pos:\t0", "flags:\t02", "tfd: x events: 1 data: 2 pos:0 ino:3 sdev:4", "tfd: 5 events: 1 data: 2 pos:0 sdev:4", "tfd: 5 events: zz data: 2 pos:0 ino:3 sdev:4"} {
		if _, _, _, _, ok := parseEpollEntry([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestSmallMessageAllocs: a 1-byte ping-pong through a link pair allocates
// nothing per message on the poller thread's path (reads, writes, epoll
// re-arming, the inline frame write, the fast delivery). The count covers
// the whole process, so the bound leaves room for timers and the runtime.
func TestSmallMessageAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short, or the race detector (its instrumentation allocates)")
	}
	a, _ := pair(t, Config{})
	app, _ := openVia(t, a, testnet.Echo(t, loopback))
	defer app.Close()
	per := testnet.RoundTripAllocs(t, app, 2000)
	t.Logf("%.3f allocations per round trip", per)
	if per > 0.5 {
		t.Errorf("%.2f allocations per round trip; the small-message path should make none", per)
	}
}

// TestPollerIdles: once nothing happens for a while, the poller thread
// stops its timer and waits in Go's poller; a message arriving then wakes
// it at once (not at the next sweep, 100 ms later), and its step runs on
// the poller thread.
func TestPollerIdles(t *testing.T) {
	a, b, app, p := idlingPair(t)
	roundTrip := func() { echoRoundTrip(t, app) }
	armed := func() bool { return tickArmed(t, p) }
	const rounds = 7
	var after []time.Duration
	for i := range rounds {
		roundTrip()
		// lingerTicks quiet ticks after the last step, then idle.
		deadline := time.Now().Add(5 * time.Second)
		for armed() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the poller's tick still runs 5 s after the last message", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(3 * schedEvery)
		polled := a.Stats.PollRecv.Load() + b.Stats.PollRecv.Load()
		start := time.Now()
		roundTrip()
		after = append(after, time.Since(start))
		if got := a.Stats.PollRecv.Load() + b.Stats.PollRecv.Load(); got == polled {
			t.Fatalf("round %d: after idling, no frame was received on the poller thread", i)
		}
	}
	// A wake-up left to the sweep's deadline would take 50 ms on average.
	slices.Sort(after)
	if med := after[rounds/2]; med > sweepEvery/4 {
		t.Errorf("round trips after idling took %v (median %v): the poller thread waits for its deadline, not the message", after, med)
	}
}

// idlingPair is a link pair without keepalives (nothing wakes the poller
// but the test's messages) and an application connection through it to an
// echo server; it skips where the poller cannot idle in Go's poller.
func idlingPair(t *testing.T) (a, b *Link, app net.Conn, p *poller) {
	t.Helper()
	dst := testnet.Echo(t, loopback)
	a, b = pair(t, Config{PingInterval: time.Hour})
	app, _ = openVia(t, a, dst)
	p = a.w.p
	if p.eprc == nil {
		t.Skip("the epoll set cannot wait in Go's poller here")
	}
	return a, b, app, p
}

// tickArmed says whether the poller's timer runs (it is stopped while idle).
func tickArmed(t *testing.T, p *poller) bool {
	t.Helper()
	var cur unix.ItimerSpec
	if err := unix.TimerfdGettime(p.tick, &cur); err != nil {
		t.Fatal(err)
	}
	return cur.Value.Nano() != 0 || cur.Interval.Nano() != 0
}

// echoRoundTrip sends 100 bytes on app and reads them back.
func echoRoundTrip(t *testing.T, app net.Conn) {
	t.Helper()
	msg := make([]byte, 100)
	if _, err := app.Write(msg); err != nil {
		t.Fatal(err)
	}
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(app, msg); err != nil {
		t.Fatal(err)
	}
}

// TestPollerLingers: messages 10 ms apart (a fifth of the linger) keep the
// poller thread ticking; idling between them woke sysmon from its sleep
// at every message (2.3 ms of CPU per round trip 20 ms apart instead of
// 0.8, bench/figures/cpu).
func TestPollerLingers(t *testing.T) {
	_, _, app, p := idlingPair(t)
	const rounds = 10
	const gap = 10 * time.Millisecond // a fifth of the linger
	idled := 0
	for range rounds {
		echoRoundTrip(t, app)
		time.Sleep(gap)
		if !tickArmed(t, p) {
			idled++
		}
	}
	// A stalled machine may stretch a sleep past the linger now and then.
	if idled > rounds/2 {
		t.Errorf("the poller idled in %d of %d pauses of %v between messages", idled, rounds, gap)
	}
}
