package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// resumingPair connects two trunks by bulk links plus an express link,
// all resuming (HELLO feature RESUME with a session per link).
func resumingPair(t testing.TB, cfg Config, bulk int) (ta, tb *Trunk, as, bs []*Link) {
	t.Helper()
	return resumingPairF(t, cfg, bulk, 0)
}

// resumingPairF is resumingPair with more HELLO features on both sides.
func resumingPairF(t testing.TB, cfg Config, bulk int, more uint8) (ta, tb *Trunk, as, bs []*Link) {
	t.Helper()
	ta, tb = NewTrunk(true, HandlerFunc(dialHandler)), NewTrunk(false, HandlerFunc(dialHandler))
	count := bulk + 1
	features := header.FeatureTrunk | header.FeatureExpress | header.FeatureResume | more
	for i := range count {
		sa, sb := rand.Uint64()|1, rand.Uint64()|1
		ca, cb, ha, hb := handshakenS(t, &cfg, i, count, features, sa, sb)
		x := i == count-1
		as = append(as, ta.AddResumable(ca, cfg, ha, i, x, sa))
		bs = append(bs, tb.AddResumable(cb, cfg, hb, i, x, sb))
	}
	t.Cleanup(func() {
		for i := range as {
			as[i].Close()
			bs[i].Close()
		}
	})
	return ta, tb, as, bs
}

// handshakenS is handshaken with sessions in both HELLOs.
func handshakenS(t testing.TB, cfg *Config, index, count int, features uint8, sa, sb uint64) (ca, cb net.Conn, ha, hb header.Hello) {
	t.Helper()
	return handshakenH(t, cfg, func(h *header.Hello, dialer bool) {
		h.LinkIndex, h.LinkCount, h.Features = uint8(index), uint8(count), features
		if dialer {
			h.Session = sa
		} else {
			h.Session = sb
		}
	})
}

// handshakenH connects over loopback and exchanges the HELLOs that edit
// makes of a default one (site 1 "a" dials site 2 "b").
func handshakenH(t testing.TB, cfg *Config, edit func(h *header.Hello, dialer bool)) (ca, cb net.Conn, ha, hb header.Hello) {
	t.Helper()
	return handshakenVia(t, cfg, edit, nil)
}

// handshakenVia is handshakenH with the dialer connecting to via(the
// acceptor's address) when via is not nil: a proxy's address.
func handshakenVia(t testing.TB, cfg *Config, edit func(h *header.Hello, dialer bool), via func(addr string) string) (ca, cb net.Conn, ha, hb header.Hello) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	addr := ln.Addr().String()
	if via != nil {
		addr = via(addr)
	}
	ca, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cb = <-acc
	if cb == nil {
		t.Fatal("accept failed")
	}
	if sealLinks {
		ca, cb = sealedPair(t, ca, cb)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 5 * time.Second // as handshaken: -race can starve a reader for seconds
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h1, h2 := cfg.Hello(1, "a", 0, 1), cfg.Hello(2, "b", 0, 1)
	edit(&h1, true)
	edit(&h2, false)
	var herr error
	done := make(chan struct{})
	go func() {
		hb, herr = Handshake(ctx, cb, h2)
		close(done)
	}()
	ha, err = Handshake(ctx, ca, h1)
	<-done
	if err != nil || herr != nil {
		t.Fatal(err, herr)
	}
	return ca, cb, ha, hb
}

// kill resets link l's connection, as `ss -K` or a middlebox would: both
// ends see it fail.
func kill(l *Link) {
	if tc := TCPOf(l.Conn()); tc != nil {
		tc.SetLinger(0)
		tc.Close()
	}
}

// waitDown waits until both links are down.
func waitDown(t testing.TB, a, b *Link) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !a.Down() || !b.Down() {
		if time.Now().After(deadline) {
			t.Fatalf("links not down after a kill: %v %v (errs %v %v)", a.Down(), b.Down(), a.Err(), b.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

// resume reconnects the down links a (dialer) and b over a new loopback
// connection, as the gateways do.
func resume(t testing.TB, cfg Config, a, b *Link) error {
	t.Helper()
	var hb1, hb2 header.Hello
	var e1, e2 error
	ca, cb, ha, hb := handshakenH(t, &cfg, func(h *header.Hello, dialer bool) {
		if dialer {
			hb1, e1 = a.ResumeHello(*h)
			*h = hb1
		} else {
			hb2, e2 = b.ResumeHello(*h)
			*h = hb2
		}
		h.LinkIndex, h.LinkCount = uint8(a.Index()), uint8(a.Peer().LinkCount)
	})
	if e1 != nil || e2 != nil {
		ca.Close()
		cb.Close()
		return errors.Join(e1, e2)
	}
	if err := a.Resume(ca, ha); err != nil {
		return err
	}
	return b.Resume(cb, hb)
}

// TestResumeLossless: checksummed streams cross a trunk whose connections
// are reset every few milliseconds and resumed; no stream sees an error,
// no byte is lost or repeated.
func TestResumeLossless(t *testing.T) {
	cfg := Config{Chunk: 32 << 10, Window: 256 << 10, ExpressMax: 4 << 10, Logger: testLogger(t)}
	_, _, as, bs := resumingPair(t, cfg, 2)
	total, kills := breakWhileStreaming(t, cfg, as, bs, 100, 2<<20, 7, 10, func(r *rand.Rand, i int) {
		kill(as[i])
		waitDown(t, as[i], bs[i])
		time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
	})
	var resumes, replayed uint64
	for i := range as {
		st := as[i].ResumeStats()
		resumes += st.Resumes
		replayed += st.Replayed + bs[i].ResumeStats().Replayed
		if err := as[i].Err(); err != nil {
			t.Fatalf("link %d failed: %v", i, err)
		}
	}
	if kills < 10 || resumes < uint64(kills) {
		t.Fatalf("%d kills, %d resumes: the test did not break the links", kills, resumes)
	}
	t.Logf("%d bytes in checksummed streams across %d resumes, %d bytes written again", total, resumes, replayed)
}

// breakWhileStreaming runs rounds of n checksummed streams of size bytes
// over as[0] (seeds from seed on) while it breaks a random link of the
// trunk with brk every 5-20 ms and resumes it, until want breaks happened
// (at most 10 rounds). It returns the bytes the streams carried and the
// breaks.
func breakWhileStreaming(t *testing.T, cfg Config, as, bs []*Link, n, size int, seed uint64, want int64, brk func(r *rand.Rand, i int)) (total, breaks int64) {
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	stop := make(chan struct{})
	var done atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, seed+1))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(5+r.IntN(15)) * time.Millisecond):
			}
			i := r.IntN(len(as))
			brk(r, i)
			if err := resume(t, cfg, as[i], bs[i]); err != nil {
				t.Errorf("resume link %d: %v", i, err)
				return
			}
			done.Add(1)
		}
	}()
	for round := uint64(0); round < 10 && (round == 0 || done.Load() < want); round++ {
		total += runStreams(t, as[0], dst, n, size, seed+round)
	}
	close(stop)
	wg.Wait()
	return total, done.Load()
}

// TestResumeAcksFree: the replay list empties as the peer acknowledges,
// and a link that carried bytes holds nothing once it is quiet.
func TestResumeAcksFree(t *testing.T) {
	// Keepalives every 20 ms; silence is judged as usual (a reader that
	// -race keeps off the CPU for 80 ms must not take the link down).
	cfg := Config{Chunk: 32 << 10, Window: 1 << 20, ReplayMax: 1 << 20, PingInterval: 20 * time.Millisecond, DeadAfter: 20 * time.Second}
	_, _, as, bs := resumingPair(t, cfg, 1)
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	runStreams(t, as[0], dst, 4, 8<<20, 9)
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, b := as[0].ResumeStats(), bs[0].ResumeStats()
		// One keepalive's PING, PONG and ACK may be in flight.
		if a.ReplayBytes <= 64 && b.ReplayBytes <= 64 && a.Sent > 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay lists hold %d and %d bytes after the streams ended (sent %d, acked %d)", a.ReplayBytes, b.ReplayBytes, a.Sent, a.Acked)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResumeBounded: while a link is down and the application keeps
// writing, the gateway holds at most the stream's window and the replay
// list at most ReplayMax plus the small frames that bypass it.
func TestResumeBounded(t *testing.T) {
	const window = 512 << 10
	cfg := Config{Chunk: 64 << 10, Window: window, ReplayMax: 256 << 10}
	_, _, as, bs := resumingPair(t, cfg, 1)
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	app, _ := openVia(t, as[0], dst)
	defer app.Close()
	kill(as[0])
	waitDown(t, as[0], bs[0])
	wrote := make(chan int64, 1)
	data := make([]byte, 32<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	go func() {
		app.SetWriteDeadline(time.Now().Add(time.Second))
		n, _ := app.Write(data)
		wrote <- int64(n)
	}()
	n := <-wrote
	if n >= int64(len(data)) {
		t.Fatalf("the application wrote all %d bytes into a down link", n)
	}
	if st := as[0].ResumeStats(); st.ReplayBytes > cfg.ReplayMax+int64(cfg.Chunk)+4096 {
		t.Fatalf("replay list holds %d bytes, ReplayMax %d", st.ReplayBytes, cfg.ReplayMax)
	}
	if q := as[0].queued.Load(); q > window {
		t.Fatalf("%d bytes queued on the down link, window %d", q, window)
	}
	if err := resume(t, cfg, as[0], bs[0]); err != nil {
		t.Fatal(err)
	}
	app.SetWriteDeadline(time.Time{})
	if _, err := app.Write(data[n:]); err != nil {
		t.Fatal(err)
	}
	wantSum(t, app, data)
}

// TestResumeWithin: a link down for longer than ResumeWithin fails, and
// its streams are reset toward their applications on both sides.
func TestResumeWithin(t *testing.T) {
	cfg := Config{PingInterval: 20 * time.Millisecond, ResumeWithin: 200 * time.Millisecond}
	_, _, as, bs := resumingPair(t, cfg, 1)
	echo := testnet.Serve(t, loopback, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
	app, _ := openVia(t, as[0], echo)
	defer app.Close()
	echoByte(t, app, 'x')
	kill(as[0])
	waitDown(t, as[0], bs[0])
	select {
	case <-as[0].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("link still down 5 s after a 200 ms resume limit")
	}
	<-bs[0].Done()
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := app.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("application read %v, want a reset", err)
	}
	if _, err := bs[0].ResumeHello(header.Hello{}); err == nil {
		t.Fatal("a failed link offered to resume")
	}
}

// TestResumeMismatch: a peer that resumes from a byte this side never
// wrote fails the link instead of corrupting a stream.
func TestResumeMismatch(t *testing.T) {
	cfg := Config{}
	_, _, as, bs := resumingPair(t, cfg, 1)
	kill(as[0])
	waitDown(t, as[0], bs[0])
	h, err := as[0].ResumeHello(as[0].Peer())
	if err != nil {
		t.Fatal(err)
	}
	h.Session = as[0].Session()
	h.Received += 1 << 30
	c1, c2 := net.Pipe()
	defer c2.Close()
	if err := as[0].Resume(c1, h); err == nil {
		t.Fatal("resumed from a byte never written")
	}
	if as[0].Err() == nil {
		t.Fatal("link not failed after an impossible resume")
	}
	wrong := h
	wrong.Session ^= 1
	if err := bs[0].Resume(c1, wrong); err == nil {
		t.Fatal("resumed another session")
	}
}

// testLogger logs the links' failures through t until t's cleanups run;
// a link torn down after that (its goroutines outlive the test by a few
// steps) writes to stderr, since t.Log after the test has ended races
// with the testing package marking it done.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	t     testing.TB
	mu    sync.Mutex
	ended bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return os.Stderr.Write(p)
	}
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestResetOnBreak: a break of a resuming link resets at once the streams
// marked ResetOnBreak, whose ends carry them on by another way, while the
// others wait for the link and go on after it resumes.
func TestResetOnBreak(t *testing.T) {
	cfg := Config{PingInterval: 20 * time.Millisecond, ResumeWithin: time.Minute}
	_, _, as, bs := resumingPair(t, cfg, 1)
	echo := testnet.Serve(t, loopback, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
	marked, ms := openVia(t, as[0], echo)
	defer marked.Close()
	kept, _ := openVia(t, as[0], echo)
	defer kept.Close()
	ms.ResetOnBreak()
	echoByte(t, marked, 'x')
	echoByte(t, kept, 'x')
	kill(as[0])
	waitDown(t, as[0], bs[0])
	marked.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := marked.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("marked stream read %v while its link waits to resume, want a reset", err)
	}
	if err := resume(t, cfg, as[0], bs[0]); err != nil {
		t.Fatal(err)
	}
	kept.SetDeadline(time.Now().Add(5 * time.Second))
	echoByte(t, kept, 'y')
}

// echoByte sends c through a stream to an echo server and checks it comes
// back.
func echoByte(t *testing.T, app *net.TCPConn, c byte) {
	t.Helper()
	if _, err := app.Write([]byte{c}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(app, b); err != nil || b[0] != c {
		t.Fatalf("echo of %q: %q, %v", c, b, err)
	}
}

// TestRenewalLossless: checksummed streams cross a trunk whose links are
// renewed every few milliseconds as the gateways renew a working express
// link: the dialer pauses it (its socket stays open, its bytes in flight
// are dropped with it), the acceptor breaks it for a renewal, and a new
// connection resumes it. No stream sees an error, no byte is lost or
// repeated, and a stream marked ResetOnBreak survives a renewal.
func TestRenewalLossless(t *testing.T) {
	cfg := Config{Chunk: 32 << 10, Window: 256 << 10, ExpressMax: 4 << 10, Logger: testLogger(t)}
	_, tb, as, bs := resumingPair(t, cfg, 2)
	echo := testnet.Serve(t, loopback, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
	marked, ms := openVia(t, as[0], echo)
	defer marked.Close()
	echoByte(t, marked, 'x')
	ms.ResetOnBreak()
	for _, s := range tb.all() { // the acceptor's end, which Break(ErrRenewal) takes down
		s.ResetOnBreak()
	}
	var old []net.Conn
	total, renewals := breakWhileStreaming(t, cfg, as, bs, 100, 2<<20, 11, 10, func(r *rand.Rand, i int) {
		old = append(old, as[i].Conn())
		if err := as[i].Pause(); err != nil {
			t.Errorf("pause link %d: %v", i, err)
		}
		if !as[i].Down() {
			t.Errorf("link %d is not down after Pause", i)
		}
		// The dialer's count is final (its reader has stopped) before
		// the acceptor, which learns of the renewal from the HELLO that
		// carries that count, breaks its end.
		done := make(chan error, 1)
		go func() {
			_, err := as[i].ResumeHello(header.Hello{})
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("link %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("link %d: its reader still runs 10 s after Pause", i) // the Break below ends it
		}
		time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
		bs[i].Break(ErrRenewal)
	})
	var resumes, replayed uint64
	for i := range as {
		resumes += as[i].ResumeStats().Renewals
		if n := as[i].ResumeStats().Resumes + bs[i].ResumeStats().Resumes; n != 0 {
			t.Errorf("link %d counts %d resumes after breaks: renewals are not breaks", i, n)
		}
		replayed += as[i].ResumeStats().Replayed + bs[i].ResumeStats().Replayed
		if err := as[i].Err(); err != nil {
			t.Fatalf("link %d failed: %v", i, err)
		}
	}
	if renewals < 10 || resumes < uint64(renewals) {
		t.Fatalf("%d renewals, %d resumes: the test did not renew the links", renewals, resumes)
	}
	// Resume closes the connection a Pause left open.
	for _, c := range old {
		if _, err := c.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a paused link's old connection is still open after its resume: write %v", err)
		}
	}
	marked.SetDeadline(time.Now().Add(5 * time.Second))
	echoByte(t, marked, 'y')
	t.Logf("%d bytes in checksummed streams across %d renewals, %d bytes written again", total, renewals, replayed)
}

// stallProxy forwards one TCP connection to target until stall is called;
// from then on it reads nothing more and drops what it had read, as a path
// that loses everything would, so the senders' socket buffers fill and
// their writes block.
func stallProxy(t testing.TB, target string) (addr string, stall func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stalled, done := make(chan struct{}), make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		close(done)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			select {
			case <-stalled:
				<-done
				return
			default:
			}
			if err != nil {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		mu.Lock()
		conns = append(conns, c, u)
		mu.Unlock()
		go pipe(u, c)
		go pipe(c, u)
	}()
	var once sync.Once
	return ln.Addr().String(), func() { once.Do(func() { close(stalled) }) }
}

// TestRenewalStalled: a link whose path stops carrying anything, with
// bytes of a stream stuck in its socket and its writer blocked on a full
// send buffer, is renewed (Pause, Break(ErrRenewal), resume on a new
// connection) and the stream goes on without losing a byte: the case for
// which renewal resumes rather than retires, since the link a gateway
// renews is the one losses have slowed.
func TestRenewalStalled(t *testing.T) {
	// A window and a replay list larger than the stalled path's socket
	// buffers (a few MiB on loopback), so the writer blocks in a write.
	cfg := Config{Chunk: 64 << 10, Window: 48 << 20, ReplayMax: 64 << 20, Logger: testLogger(t), ResumeWithin: time.Minute}
	ta, tb := NewTrunk(true, HandlerFunc(dialHandler)), NewTrunk(false, HandlerFunc(dialHandler))
	features := header.FeatureTrunk | header.FeatureExpress | header.FeatureResume
	var as, bs []*Link
	var stall func()
	for i := range 2 {
		sa, sb := rand.Uint64()|1, rand.Uint64()|1
		var via func(string) string
		if i == 0 { // the bulk link, which homes the stream, crosses the proxy
			via = func(addr string) string {
				var a string
				a, stall = stallProxy(t, addr)
				return a
			}
		}
		ca, cb, ha, hb := handshakenVia(t, &cfg, func(h *header.Hello, dialer bool) {
			h.LinkIndex, h.LinkCount, h.Features = uint8(i), 2, features
			h.Session = sb
			if dialer {
				h.Session = sa
			}
		}, via)
		as = append(as, ta.AddResumable(ca, cfg, ha, i, i == 1, sa))
		bs = append(bs, tb.AddResumable(cb, cfg, hb, i, i == 1, sb))
	}
	t.Cleanup(func() {
		for i := range as {
			as[i].Close()
			bs[i].Close()
		}
	})
	echo := testnet.Serve(t, loopback, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
	app, _ := openVia(t, as[0], echo)
	defer app.Close()
	echoByte(t, app, 'x')

	stall()
	data := make([]byte, 40<<20)
	for i := range data {
		data[i] = byte(i*13 + i>>9)
	}
	got := make(chan error, 1)
	go func() {
		back := make([]byte, len(data))
		app.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := io.ReadFull(app, back)
		if err == nil && !bytes.Equal(back, data) {
			err = errors.New("the echo differs from what was sent")
		}
		got <- err
	}()
	go app.Write(data)
	// Wait until the link's writer is stuck on the stalled socket: what it
	// has written stops growing, well short of the data.
	for deadline, last := time.Now().Add(10*time.Second), uint64(0); ; time.Sleep(200 * time.Millisecond) {
		n := as[0].Stats.BytesSent.Load()
		if n >= 1<<20 && n == last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("link 0 wrote %d bytes toward the stalled path and goes on", n)
		}
		last = n
	}
	if n := as[0].Stats.BytesSent.Load(); n >= uint64(len(data)) {
		t.Fatalf("link 0 wrote all %d bytes toward the stalled path: the test did not stall it", n)
	}
	if err := as[0].Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := as[0].ResumeHello(header.Hello{}); err != nil {
		t.Fatal(err)
	}
	bs[0].Break(ErrRenewal)
	resumed := make(chan error, 1)
	go func() { resumed <- resume(t, cfg, as[0], bs[0]) }()
	select {
	case err := <-resumed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the paused link did not resume within 20 s: a writer blocked on the stalled socket?")
	}
	if err := <-got; err != nil {
		t.Fatalf("stream across the renewal of a stalled link: %v", err)
	}
	st := as[0].ResumeStats()
	if st.Renewals != 1 || st.Replayed == 0 {
		t.Fatalf("link 0: %+v, want one renewal that wrote stuck bytes again", st)
	}
	t.Logf("%d bytes written again after the renewal of a stalled link", st.Replayed+bs[0].ResumeStats().Replayed)
}
