package relay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// pair connects two links over loopback TCP. The acceptor side (b) dials
// the OPEN's destination and accepts the stream, as a far gateway does.
func pair(t testing.TB, cfg Config) (a, b *Link) {
	t.Helper()
	ca, cb, ha, hb := handshaken(t, &cfg, 0, 1, 0)
	a = NewLink(ca, cfg, ha, true, HandlerFunc(dialHandler))
	b = NewLink(cb, cfg, hb, false, HandlerFunc(dialHandler))
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// handshaken returns both ends of a loopback TCP connection after the HELLO
// exchange of link index of count (site 1 "a" dials site 2 "b"), with
// the peer HELLO each end received.
func handshaken(t testing.TB, cfg *Config, index, count int, features uint8) (ca, cb net.Conn, ha, hb header.Hello) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	ca, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	cb = r.c
	if sealLinks {
		ca, cb = sealedPair(t, ca, cb)
	}
	if cfg.PingInterval == 0 {
		// Dead after 20 s: under -race, hundreds of busy goroutines in this
		// one process can keep a link's reader off the CPU for seconds.
		cfg.PingInterval = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var herr error
	done := make(chan struct{})
	hello := func(site uint8, name string) header.Hello {
		h := cfg.Hello(site, name, uint8(index), uint8(count))
		h.Features = features
		return h
	}
	go func() {
		hb, herr = Handshake(ctx, cb, hello(2, "b"))
		close(done)
	}()
	ha, err = Handshake(ctx, ca, hello(1, "a"))
	<-done
	if err != nil || herr != nil {
		t.Fatal(err, herr)
	}
	if ha.Name != "b" || hb.Name != "a" {
		t.Fatalf("hello names %q %q", ha.Name, hb.Name)
	}
	return ca, cb, ha, hb
}

func dialHandler(s *Stream, o *header.Open) {
	go func() {
		c, err := net.DialTimeout("tcp", o.Dst.String(), 10*time.Second)
		if err != nil {
			s.Refuse(header.CodeRefused)
			return
		}
		// A stream that ended while its destination was being dialled was
		// cut: the destination sees a reset, as the gateway does it.
		if tc := WrapTCP(c.(*net.TCPConn)); s.Accept(tc) != nil {
			tc.Abort()
		}
	}()
}

// openVia creates a loopback connection whose server end is handed to link
// l as a stream toward dst; it returns the application's end.
func openVia(t testing.TB, l *Link, dst netip.AddrPort) (*net.TCPConn, *Stream) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	app, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	o := header.Open{Dst: dst, Src: app.LocalAddr().(*net.TCPAddr).AddrPort()}
	s, err := l.Open(&o, WrapTCP(gw))
	if err != nil {
		t.Fatal(err)
	}
	return app, s
}

// loopback is where the tests' destinations listen.
var loopback = netip.MustParseAddr("127.0.0.1")

// sumStream opens, over a new pair with cfg, a stream from app to a
// testnet.SumServer, and returns n bytes of a pattern to send on it.
func sumStream(t *testing.T, cfg Config, n int) (a *Link, app *net.TCPConn, s *Stream, data []byte) {
	t.Helper()
	a, _ = pair(t, cfg)
	app, s = openVia(t, a, testnet.Serve(t, loopback, testnet.SumServer))
	t.Cleanup(func() { app.Close() })
	data = make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	return a, app, s, data
}

func TestHalfClose(t *testing.T) {
	a, app, s, data := sumStream(t, Config{Chunk: 16 << 10, Window: 64 << 10}, 1<<20+7)
	if _, err := app.Write(data); err != nil {
		t.Fatal(err)
	}
	// Our shutdown(SHUT_WR) must reach the server as EOF while the reverse
	// direction still works: the server only answers after EOF.
	wantSum(t, app, data)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("stream did not finish after both half-closes")
	}
	if s.Code() != 0 {
		t.Fatalf("clean close ended with code %v", s.Code())
	}
	waitStreams(t, a, 0)
}

// TestBulkInline: a lone stream's chunks are written by its own goroutine
// while the link is idle (no hand-off to the writer per chunk), and its
// bytes arrive intact.
func TestBulkInline(t *testing.T) {
	a, app, _, data := sumStream(t, Config{}, 16<<20+3)
	if _, err := app.Write(data); err != nil {
		t.Fatal(err)
	}
	wantSum(t, app, data)
	inline, frames := a.Stats.InlineSent.Load(), a.Stats.FramesSent.Load()
	t.Logf("%d of %d frames written inline", inline, frames)
	if frames < 16<<20/(128<<10) || inline < frames/2 { // the default chunk is 128 KiB
		t.Fatalf("%d of %d frames written inline, want most", inline, frames)
	}
}

// wantSum half-closes app, whose far end is a testnet.SumServer, and checks the
// SHA-256 it answers against data.
func wantSum(t *testing.T, app *net.TCPConn, data []byte) {
	t.Helper()
	app.CloseWrite()
	got, err := io.ReadAll(app)
	if err != nil {
		t.Fatal(err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(got, want[:]) {
		t.Fatalf("checksum mismatch: got %x, want %x", got, want)
	}
}

func waitStreams(t testing.TB, l *Link, n int) {
	t.Helper()
	for i := 0; l.NumStreams() != n; i++ {
		if i > 500 {
			t.Fatalf("link still has %d streams, want %d", l.NumStreams(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// expectReset waits up to within for what (a destination's read error,
// sent on got) and fails the test unless it is ECONNRESET.
func expectReset(t *testing.T, got <-chan error, within time.Duration, what string) {
	t.Helper()
	select {
	case err := <-got:
		if !isReset(err) {
			t.Fatalf("%s read %v, want ECONNRESET", what, err)
		}
	case <-time.After(within):
		t.Fatalf("%s not reset within %v", what, within)
	}
}

func TestResetFromDestination(t *testing.T) {
	a, b := pair(t, Config{})
	dst := testnet.Serve(t, loopback, func(c *net.TCPConn) {
		buf := make([]byte, 5)
		io.ReadFull(c, buf)
		c.SetLinger(0)
		c.Close() // RST
	})
	app, _ := openVia(t, a, dst)
	defer app.Close()
	app.Write([]byte("hello"))
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := app.Read(make([]byte, 10))
	if !isReset(err) {
		t.Fatalf("application read: %v, want ECONNRESET", err)
	}
	waitStreams(t, a, 0)
	waitStreams(t, b, 0)
}

func TestResetFromSource(t *testing.T) {
	a, b := pair(t, Config{})
	got := make(chan error, 1)
	dst := testnet.Serve(t, loopback, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		got <- err
	})
	app, _ := openVia(t, a, dst)
	app.Write([]byte("x"))
	time.Sleep(50 * time.Millisecond)
	app.SetLinger(0)
	app.Close()
	expectReset(t, got, 5*time.Second, "destination")
	waitStreams(t, a, 0)
	waitStreams(t, b, 0)
}

func TestRefused(t *testing.T) {
	a, _ := pair(t, Config{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close() // nothing listens there now
	app, s := openVia(t, a, dst)
	defer app.Close()
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := app.Read(make([]byte, 1))
	if !isReset(err) {
		t.Fatalf("read: %v, want ECONNRESET", err)
	}
	if s.Code() != header.CodeRefused {
		t.Fatalf("code %v, want refused", s.Code())
	}
}

// TestManyStreams runs concurrent streams of random sizes through the pair
// with end-to-end checksums (the gateway test does the 1000-stream version).
func TestManyStreams(t *testing.T) {
	a, _ := pair(t, Config{Chunk: 32 << 10, Window: 128 << 10})
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	runStreams(t, a, dst, 200, 1<<20, 1)
}

func runStreams(t testing.TB, l *Link, dst netip.AddrPort, n, maxSize int, seed uint64) int64 {
	total, errs := testnet.Streams(n, seed, func(r *rand.Rand) int { return r.IntN(maxSize + 1) },
		func() (*net.TCPConn, func() string, error) {
			app, st := openVia(t, l, dst)
			return app, func() string { return fmt.Sprintf("stream code %v, link err %v", st.Code(), l.Err()) }, nil
		})
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
	return total
}

// TestStalledReceiver: a destination that never reads stalls only its own
// stream; others keep flowing and the gateway buffers at most a window.
func TestStalledReceiver(t *testing.T) {
	const window = 256 << 10
	a, b := pair(t, Config{Chunk: 64 << 10, Window: window})
	block := make(chan struct{})
	stuck := testnet.Serve(t, loopback, func(c *net.TCPConn) { <-block; c.Close() })
	defer close(block)
	app, s := openVia(t, a, stuck)
	defer app.Close()
	wrote := make(chan int64, 1)
	go func() {
		app.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, _ := io.Copy(app, io.LimitReader(zeroReader{}, 64<<20))
		wrote <- n
	}()
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	runStreams(t, a, dst, 20, 4<<20, 2)
	n := <-wrote
	// The stuck stream got as far as the kernel buffers plus one window.
	if n >= 64<<20 {
		t.Fatalf("stalled stream accepted all %d bytes", n)
	}
	bs := b.lookup(s.id)
	if bs == nil {
		t.Fatal("stalled stream vanished on the far side")
	}
	bs.mu.Lock()
	queued := int64(window) - bs.recvAvail
	bs.mu.Unlock()
	if queued > window {
		t.Fatalf("far side holds %d bytes for the stalled stream, window is %d", queued, window)
	}
	if a.Stats.WindowStalls.Load() == 0 {
		t.Fatal("no window stall recorded")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestLinkLoss: killing the link resets every stream's application on both
// sides at once.
func TestLinkLoss(t *testing.T) {
	a, b := pair(t, Config{})
	farErr := make(chan error, 5)
	dst := testnet.Serve(t, loopback, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		farErr <- err
	})
	var apps []*net.TCPConn
	for range 5 {
		app, _ := openVia(t, a, dst)
		app.Write([]byte("x"))
		apps = append(apps, app)
	}
	waitStreams(t, b, 5)
	start := time.Now()
	b.Conn().(*net.TCPConn).SetLinger(0)
	b.Conn().Close() // the WAN connection dies under the far gateway
	for _, app := range apps {
		app.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := app.Read(make([]byte, 1)); !isReset(err) {
			t.Fatalf("application read after link loss: %v", err)
		}
		app.Close()
	}
	for range 5 {
		expectReset(t, farErr, 3*time.Second, "destination after link loss")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("streams failed after %v", d)
	}
	<-a.Done()
	<-b.Done()
}

// TestHostilePeer feeds garbage and protocol violations to a link: it must
// close the link with an error, never panic or hang.
func TestHostilePeer(t *testing.T) {
	cases := map[string][]byte{
		"garbage":      bytes.Repeat([]byte{0xff}, 100),
		"data unknown": header.AppendFrame(nil, header.TypeData, 99, []byte("abc")),
		"bad parity":   header.AppendFrame(nil, header.TypeOpen, 2, make([]byte, 14)),
		"open garbage": header.AppendFrame(nil, header.TypeOpen, 1, bytes.Repeat([]byte{9}, 14)),
		"hello again":  header.AppendFrame(nil, header.TypeHello, 0, make([]byte, 13)),
		"truncated":    header.AppendFrame(nil, header.TypeData, 1, []byte("abc"))[:13],
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) { hostile(t, in, false) })
	}
}

// hostile feeds in to a link over a pipe, where the link reads in its own
// goroutine, and over loopback TCP, where the poller thread reads whole
// frames.
func hostile(t testing.TB, in []byte, trunk bool) {
	c1, c2 := net.Pipe()
	hostileOn(t, c1, c2, in, trunk)
	c3, c4 := tcpPair(t)
	defer c3.Close()
	hostileOn(t, c4, c3, in, trunk)
}

func hostileOn(t testing.TB, c1, c2 net.Conn, in []byte, trunk bool) {
	ph := header.Hello{SiteID: 9, LinkCount: 1, MaxPayload: header.MaxPayload, Window: 1 << 16, Name: "evil"}
	refuse := HandlerFunc(func(s *Stream, o *header.Open) { s.Refuse(header.CodePolicy) })
	var l *Link
	if trunk {
		// Streams are accepted here (and never read), so DATA_AT and
		// HALF_CLOSE offsets reach the reorder logic.
		l = NewTrunk(false, HandlerFunc(func(s *Stream, o *header.Open) {})).Add(c1, Config{PingInterval: time.Hour}, ph, 0, false)
	} else {
		l = NewLink(c1, Config{PingInterval: time.Hour}, ph, false, refuse)
	}
	go io.Copy(io.Discard, c2)
	c2.Write(in)
	c2.Close()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("link did not end")
	}
	if l.Err() == nil {
		t.Fatal("link ended without an error")
	}
}

func FuzzLinkReader(f *testing.F) {
	var s []byte
	o, _ := header.AppendOpen(nil, &header.Open{Dst: netip.MustParseAddrPort("10.0.0.1:1"), Src: netip.MustParseAddrPort("10.0.0.2:2")})
	s = header.AppendFrame(s, header.TypeOpen, 1, o)
	s = header.AppendFrame(s, header.TypeData, 1, []byte("abc"))
	s = header.AppendFrame(s, header.TypeWindow, 1, []byte{0, 0, 1, 0})
	s = header.AppendFrame(s, header.TypeHalfClose, 1, nil)
	s = header.AppendFrame(s, header.TypeReset, 1, []byte{0, 0, 0, 7})
	s = header.AppendFrame(s, header.TypePing, 0, []byte("12345678"))
	f.Add(s, false)
	f.Add(s[:30], false)
	// A trunk link: DATA_AT out of order, a duplicate, HALF_CLOSE at an offset.
	s = header.AppendFrame(nil, header.TypeOpen, 3, o)
	s = header.AppendFrame(s, header.TypeDataAt, 3, []byte{0, 0, 0, 3, 'd', 'e'})
	s = header.AppendFrame(s, header.TypeDataAt, 3, []byte{0, 0, 0, 0, 'a', 'b', 'c'})
	s = header.AppendFrame(s, header.TypeHalfClose, 3, []byte{0, 0, 0, 5})
	s = header.AppendFrame(s, header.TypeDataAt, 3, []byte{0, 0, 0, 1, 'x'})
	f.Add(s, true)
	f.Fuzz(func(t *testing.T, in []byte, trunk bool) { hostile(t, in, trunk) })
}

func TestPool(t *testing.T) {
	for _, n := range []int{1, 512, 513, 4096, 128 << 10, 1 << 20} {
		p := getBuf(n)
		if len(*p) != n || cap(*p) < n {
			t.Fatalf("getBuf(%d): len %d cap %d", n, len(*p), cap(*p))
		}
		putBuf(p)
	}
}

// BenchmarkStream: one bulk stream through a link pair on loopback (source
// -> link a -> link b -> sink), with one or two chunks in flight per stream
// (single vs double buffering).
func BenchmarkStream(b *testing.B) {
	for _, depth := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("pipeline=%d", depth), func(b *testing.B) {
			a, _ := pair(b, Config{Pipeline: depth})
			done := make(chan int64, 1)
			dst := testnet.Serve(b, loopback, func(c *net.TCPConn) { n, _ := io.Copy(io.Discard, c); done <- n })
			app, _ := openVia(b, a, dst)
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			c0 := cpu()
			for b.Loop() {
				if _, err := app.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			app.CloseWrite()
			<-done
			app.Close()
			b.ReportMetric(float64((cpu()-c0).Milliseconds())/(float64(b.N)*float64(len(buf))/1e9), "cpu-ms/GB")
		})
	}
}

// TestFramesBeforeEOF: frames that arrive together with the peer's FIN are
// handled before the end of file ends the link. A large frame makes the
// reader read on a worker with blocking reads, which buffer what follows
// it; a small frame then sends it back to non-blocking reads, whose next
// read finds the end of file while one more frame waits in the buffer
// (an express link's RETIRE was lost this way when the dialer closed the
// retired link right after writing it).
func TestFramesBeforeEOF(t *testing.T) {
	c1, c2 := tcpPair(t)
	defer c2.Close()
	ph := header.Hello{SiteID: 9, LinkCount: 1, MaxPayload: header.MaxPayload, Window: 1 << 16, Name: "peer",
		Features: header.FeaturePad}
	l := NewLink(c1, Config{PingInterval: time.Hour}, ph, false,
		HandlerFunc(func(s *Stream, o *header.Open) { s.Refuse(header.CodePolicy) }))
	go io.Copy(io.Discard, c2)
	var in []byte
	in = header.AppendFrame(in, header.TypePad, 0, make([]byte, 200<<10))
	in = header.AppendFrame(in, header.TypePing, 0, make([]byte, 8))
	in = header.AppendFrame(in, header.TypePing, 0, make([]byte, 8))
	if _, err := c2.Write(in); err != nil {
		t.Fatal(err)
	}
	c2.CloseWrite()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("link did not end at the peer's FIN")
	}
	if got := l.Stats.FramesRecv.Load(); got != 3 {
		t.Errorf("%d frames handled before the end of file, want 3 (err %v)", got, l.Err())
	}
}
