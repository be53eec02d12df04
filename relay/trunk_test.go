package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// trunkPair connects two trunks by bulk loopback links plus, if express,
// an express link (the last index), as two gateways of a site pair do.
func trunkPair(t testing.TB, cfg Config, bulk int, express bool) (ta, tb *Trunk, as, bs []*Link) {
	return trunkPairF(t, cfg, bulk, express, 0)
}

// trunkPairF is trunkPair with more HELLO features.
func trunkPairF(t testing.TB, cfg Config, bulk int, express bool, more uint8) (ta, tb *Trunk, as, bs []*Link) {
	t.Helper()
	ta, tb = NewTrunk(true, HandlerFunc(dialHandler)), NewTrunk(false, HandlerFunc(dialHandler))
	count := bulk
	features := header.FeatureTrunk | more
	if express {
		count++
		features |= header.FeatureExpress
	}
	for i := range count {
		ca, cb, ha, hb := handshaken(t, &cfg, i, count, features)
		x := express && i == count-1
		as = append(as, ta.Add(ca, cfg, ha, i, x))
		bs = append(bs, tb.Add(cb, cfg, hb, i, x))
	}
	t.Cleanup(func() {
		for i := range as {
			as[i].Close()
			bs[i].Close()
		}
	})
	return ta, tb, as, bs
}

// mixedEcho drives one stream to an echo server. Each round writes a large
// block and, 2 ms later, 20 small messages: when the gateway has read the
// block by then, the messages take the express link while the block's
// chunks are still on the bulk links, and overtake them. It then reads
// the echo back, pauses, and sends one more message, which must be a new
// burst and take the express link whatever the machine's load.
func mixedEcho(app *net.TCPConn, seed byte) error {
	big := make([]byte, 300<<10)
	got := make([]byte, len(big)+80)
	for round := range 12 {
		for j := range big {
			big[j] = byte(j) ^ seed ^ byte(round)
		}
		want := append([]byte(nil), big...)
		if _, err := app.Write(big); err != nil {
			return err
		}
		time.Sleep(4 * burstGap)
		for k := range 20 {
			msg := []byte{seed, byte(round), byte(k), 0xAA}
			if _, err := app.Write(msg); err != nil {
				return err
			}
			want = append(want, msg...)
		}
		if _, err := io.ReadFull(app, got); err != nil {
			return fmt.Errorf("round %d: reading the echo: %w", round, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("round %d: the echo differs from what was sent", round)
		}
		time.Sleep(2 * burstGap)
		msg := []byte{seed, byte(round), 0xBB, 0xCC}
		if _, err := app.Write(msg); err != nil {
			return err
		}
		if _, err := io.ReadFull(app, got[:4]); err != nil || !bytes.Equal(got[:4], msg) {
			return fmt.Errorf("round %d: echo of the lone message %x, %v", round, got[:4], err)
		}
	}
	return nil
}

// echoStreams runs n streams through l to an echo server, each driven by
// f until it returns, then checks that each ends cleanly: after its
// CloseWrite the echo's EOF comes with no more bytes.
func echoStreams(t *testing.T, l *Link, n int, f func(i int, app *net.TCPConn) error) {
	t.Helper()
	dst := testnet.Echo(t, loopback)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			app, st := openVia(t, l, dst)
			defer app.Close()
			app.SetDeadline(time.Now().Add(60 * time.Second))
			if err := f(i, app); err != nil {
				t.Errorf("stream %d: %v (code %v)", i, err, st.Code())
				return
			}
			app.CloseWrite()
			if rest, err := io.ReadAll(app); err != nil || len(rest) != 0 {
				t.Errorf("stream %d: after the last echo %d more bytes, %v (code %v)", i, len(rest), err, st.Code())
			}
		}()
	}
	wg.Wait()
}

// TestTrunkStripesAndReorders: streams whose large writes are striped over
// two bulk links while their messages take the express link arrive intact
// and in order in both directions, and HALF_CLOSE, which carries the final
// offset, ends each only after its last byte (the echo server would end
// early otherwise).
func TestTrunkStripesAndReorders(t *testing.T) {
	_, tb, as, _ := trunkPair(t, Config{Chunk: 32 << 10, Window: 512 << 10}, 2, true)
	echoStreams(t, as[0], 8, func(i int, app *net.TCPConn) error { return mixedEcho(app, byte(i)) })
	// Both bulk links and the express link carried data.
	for i, l := range as {
		if l.Stats.BytesSent.Load() == 0 {
			t.Errorf("link %d (express %v) carried no data", i, l.Express())
		}
	}
	// Only messages, bursts of at most ExpressMax bytes, take the express link.
	if x, f := as[2].Stats.BytesSent.Load(), as[2].Stats.FramesSent.Load(); x > f*16<<10 {
		t.Errorf("express link carried %d bytes in %d frames: more than messages", x, f)
	}
	for i := 0; tb.NumStreams() != 0; i++ {
		if i > 500 {
			t.Fatalf("far trunk still has %d streams", tb.NumStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTrunkManyStreams: the random-size run of TestManyStreams on a trunk of
// three bulk links and an express link.
func TestTrunkManyStreams(t *testing.T) {
	_, _, as, _ := trunkPair(t, Config{Chunk: 32 << 10, Window: 128 << 10}, 3, true)
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	runStreams(t, as[1], dst, 100, 1<<20, 3)
}

// TestTrunkLinkLoss: when the express link dies, the streams whose bytes
// crossed it are reset on both sites (their home link is still up, so the
// reset travels as RESET), and a stream that never used it keeps working
// over the bulk links.
func TestTrunkLinkLoss(t *testing.T) {
	_, tb, as, bs := trunkPair(t, Config{}, 1, true)
	echo := testnet.Echo(t, loopback)
	farErr := make(chan error, 1)
	sink := testnet.Serve(t, loopback, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		farErr <- err
	})
	// crossing: small messages once the OPEN is confirmed, so over express.
	crossing, _ := openVia(t, as[0], sink)
	defer crossing.Close()
	for range 20 {
		crossing.Write([]byte("ping"))
		time.Sleep(5 * time.Millisecond)
	}
	// quiet: opened after the express link carried data, then idle.
	quiet, qs := openVia(t, as[0], echo)
	defer quiet.Close()
	for i := 0; as[2-1].Stats.BytesSent.Load() == 0; i++ {
		if i > 300 {
			t.Fatal("the small messages never took the express link")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; tb.NumStreams() != 2; i++ {
		if i > 300 {
			t.Fatalf("far trunk has %d streams, want 2", tb.NumStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
	bs[1].Conn().(*net.TCPConn).SetLinger(0)
	bs[1].Conn().Close() // the express link dies under the far gateway
	crossing.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := crossing.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("application of a stream that crossed the dead link read %v, want ECONNRESET", err)
	}
	expectReset(t, farErr, 3*time.Second, "destination of a stream that crossed the dead link")
	// The quiet stream goes on over the bulk link once both sides know the
	// express link is down (a stream whose next bytes take a link in the
	// instant it fails is reset with the link's streams, as it should be).
	for i := 0; as[1].Err() == nil || bs[1].Err() == nil; i++ {
		if i > 300 {
			t.Fatalf("express link errors: near %v, far %v", as[1].Err(), bs[1].Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	msg := bytes.Repeat([]byte("q"), 100)
	if _, err := quiet.Write(msg); err != nil {
		t.Fatal(err)
	}
	quiet.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(quiet, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("stream that never used the dead link: %q, %v (code %v, links used %b)", got[:4], err, qs.Code(), qs.used.Load())
	}
	if as[0].Err() != nil {
		t.Fatalf("bulk link failed too: %v", as[0].Err())
	}
}

// TestReorder drives one stream's receive side directly: payloads queued
// in offset order whatever their arrival order; an early HALF_CLOSE becomes
// EOF only at its offset; duplicates and bytes past the end are refused.
func TestReorder(t *testing.T) {
	cfg := Config{Window: 1 << 20}
	cfg.fillDefaults()
	tr := NewTrunk(true, nil)
	l := newLink(nil, cfg, header.Hello{Window: 1 << 20, MaxPayload: header.MaxPayload}, tr, 0, false, 0)
	s := newStream(l)
	buf := func(b string) *[]byte { p := getBuf(len(b)); copy(*p, b); return p }
	queued := func() string {
		var out []byte
		for _, p := range s.recvq {
			out = append(out, *p...)
		}
		return string(out)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.pushAt(6, true, buf("ghi")))
	must(s.pushAt(3, true, buf("def")))
	if q := queued(); q != "" {
		t.Fatalf("queued %q before offset 0 arrived", q)
	}
	must(s.pushEnd(12))
	must(s.pushAt(0, true, buf("abc")))
	if q := queued(); q != "abcdefghi" || s.recvEOF {
		t.Fatalf("queued %q eof %v, want abcdefghi without EOF", q, s.recvEOF)
	}
	if err := s.pushAt(3, true, buf("xyz")); err == nil {
		t.Fatal("a duplicate offset was accepted")
	}
	if err := s.pushAt(9, true, buf("jklm")); err == nil {
		t.Fatal("bytes past the HALF_CLOSE offset were accepted")
	}
	must(s.pushAt(9, true, buf("jkl")))
	if q := queued(); q != "abcdefghijkl" || !s.recvEOF {
		t.Fatalf("queued %q eof %v, want abcdefghijkl and EOF", q, s.recvEOF)
	}
	if err := s.pushEnd(12); err == nil {
		t.Fatal("a second HALF_CLOSE was accepted")
	}
}

// TestExpressBudget: a stream may put ExpressMax bytes per round trip of the
// express link on it, refilled in proportion to the time elapsed, and never
// assumes a round trip shorter than ExpressFloor.
func TestExpressBudget(t *testing.T) {
	cfg := Config{ExpressMax: 64 << 10}
	cfg.fillDefaults()
	l := newLink(nil, cfg, header.Hello{Window: 1 << 20, MaxPayload: header.MaxPayload}, NewTrunk(true, nil), 0, false, 0)
	s := newStream(l)
	const rtt = 20 * time.Millisecond
	now := time.Now()
	if !s.expressBudget(64<<10, rtt, now) {
		t.Fatal("a new stream cannot send one full message express")
	}
	if s.expressBudget(4<<10, rtt, now) {
		t.Fatal("a stream sent more than its budget express")
	}
	now = now.Add(rtt / 2) // half a round trip later: half the budget
	if !s.expressBudget(30<<10, rtt, now) {
		t.Error("half a round trip did not refill half the budget")
	}
	if s.expressBudget(8<<10, rtt, now) {
		t.Error("half a round trip refilled more than half the budget")
	}
	now = now.Add(2 * rtt) // long idle: full, never more
	if !s.expressBudget(64<<10, rtt, now) || s.expressBudget(4<<10, rtt, now) {
		t.Error("after a long pause the budget is not exactly one message")
	}
	// A 1 ms link counts as ExpressFloor: after 1 ms, a fifth of the budget.
	now = now.Add(time.Millisecond)
	if s.expressBudget(32<<10, time.Millisecond, now) {
		t.Errorf("a link RTT below ExpressFloor (%v) refilled the budget faster", ExpressFloor)
	}
}

// TestTrunkRenewExpress: replacing a working express link (HELLO feature
// RENEW) under traffic loses, duplicates and resets nothing: streams that
// keep exchanging messages while the express link is renewed 20 times get
// every echo back intact, each old link ends with ErrLinkRetired once its
// RETIRE has crossed both ways, and the new links carry the messages.
func TestTrunkRenewExpress(t *testing.T) {
	cfg := Config{Chunk: 32 << 10, Window: 512 << 10}
	features := header.FeatureTrunk | header.FeatureExpress | header.FeatureRenew
	ta, tb, as, bs := trunkPairF(t, cfg, 1, true, header.FeatureRenew)
	stop := make(chan struct{})
	streams := make(chan struct{})
	go func() {
		defer close(streams)
		echoStreams(t, as[0], 4, func(i int, app *net.TCPConn) error {
			msg := make([]byte, 2000+i*3000)
			got := make([]byte, len(msg))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return nil
				default:
				}
				for j := range msg {
					msg[j] = byte(n*7 + j + i)
				}
				if _, err := app.Write(msg); err != nil {
					return fmt.Errorf("message %d: %w", n, err)
				}
				if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, msg) {
					return fmt.Errorf("message %d: echo differs or failed: %v", n, err)
				}
				time.Sleep(time.Duration(n%3) * burstGap) // bursts of one and of several messages
			}
		})
	}()
	const x = 1 // the express link's index
	oldA, oldB := as[x], bs[x]
	var carried uint64
	for r := range 20 {
		time.Sleep(30 * time.Millisecond)
		ca, cb, ha, hb := handshaken(t, &cfg, x, 2, features)
		// Either side may install its new link first.
		var na, nb *Link
		if r%2 == 0 {
			na, nb = ta.Add(ca, cfg, ha, x, true), tb.Add(cb, cfg, hb, x, true)
		} else {
			nb, na = tb.Add(cb, cfg, hb, x, true), ta.Add(ca, cfg, ha, x, true)
		}
		t.Cleanup(func() { na.Close(); nb.Close() })
		for _, old := range []*Link{oldA, oldB} {
			select {
			case <-old.Done():
				if !errors.Is(old.Err(), ErrLinkRetired) {
					t.Fatalf("renewal %d: old express link ended with %v, want ErrLinkRetired", r, old.Err())
				}
			case <-time.After(3 * time.Second): // before the next keepalive PING could kick a stuck writer
				t.Fatalf("renewal %d: the old express link did not retire", r)
			}
		}
		carried += oldA.Stats.BytesSent.Load() + oldB.Stats.BytesSent.Load()
		oldA, oldB = na, nb
	}
	close(stop)
	<-streams
	if carried == 0 {
		t.Errorf("the renewed express links carried no messages")
	}
	// Both ends close their streams once the echo's EOF has gone through.
	for i := 0; ta.NumStreams()+tb.NumStreams() > 0; i++ {
		if i == 500 {
			t.Fatalf("streams left: %d and %d", ta.NumStreams(), tb.NumStreams())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTrunkRenewRequest: the acceptor asks for a renewal with RENEW, at
// most once per gap, and the dialer's OnRenew runs; the dialer itself never
// sends RENEW, and RETIRE or RENEW on a link without the feature is a
// protocol error.
func TestTrunkRenewRequest(t *testing.T) {
	ta, _, as, bs := trunkPairF(t, Config{}, 1, true, header.FeatureRenew)
	asked := make(chan struct{}, 4)
	ta.OnRenew(func() { asked <- struct{}{} })
	if as[1].RequestRenew(0) {
		t.Errorf("the dialer sent RENEW")
	}
	if !bs[1].RequestRenew(time.Hour) {
		t.Fatalf("the acceptor did not send RENEW")
	}
	if bs[1].RequestRenew(time.Hour) {
		t.Errorf("a second RENEW within the gap")
	}
	if bs[0].RequestRenew(0) {
		t.Errorf("RENEW on a bulk link")
	}
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatalf("the dialer's OnRenew did not run")
	}

	_, _, ps, _ := trunkPair(t, Config{}, 1, true)
	for _, typ := range []header.Type{header.TypeRetire, header.TypeRenew} {
		if err := ps[1].dispatch(header.Header{Type: typ}, nil); err == nil {
			t.Errorf("%v on a link without the RENEW feature accepted", typ)
		}
	}
	if err := as[0].dispatch(header.Header{Type: header.TypeRetire}, nil); err == nil {
		t.Errorf("RETIRE on a bulk link accepted")
	}
}

// TestPad: PAD frames cross to a peer that takes them (HELLO feature PAD),
// at most one chunk each, are counted and dropped there, and leave the link
// working; without the feature Pad refuses and a received PAD is a protocol
// error.
func TestPad(t *testing.T) {
	cfg := Config{Chunk: 64 << 10}
	_, _, as, bs := trunkPairF(t, cfg, 1, true, header.FeaturePad)
	var want uint64
	for _, n := range []int{0, 1, 5000, 200 << 10} {
		got, err := as[1].Pad(n)
		if err != nil {
			t.Fatalf("Pad(%d): %v", n, err)
		}
		if w := min(n, 64<<10); got != w {
			t.Errorf("Pad(%d) wrote %d, want %d", n, got, w)
		}
		want += uint64(got)
	}
	if _, err := bs[0].Pad(1000); err != nil { // the other way, on a bulk link
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for bs[1].Stats.PadRecv.Load() != want || as[0].Stats.PadRecv.Load() != 1000 {
		if time.Now().After(deadline) {
			t.Fatalf("PAD received: %d and %d bytes, want %d and 1000", bs[1].Stats.PadRecv.Load(), as[0].Stats.PadRecv.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if as[1].Stats.PadSent.Load() != want {
		t.Errorf("PAD sent: %d bytes, want %d", as[1].Stats.PadSent.Load(), want)
	}
	for _, l := range append(as, bs...) {
		if err := l.Err(); err != nil {
			t.Fatalf("link %d failed: %v", l.Index(), err)
		}
	}

	_, _, ps, _ := trunkPair(t, Config{}, 1, true)
	if _, err := ps[1].Pad(100); err != ErrNoPad {
		t.Errorf("Pad to a peer without feature PAD: %v, want ErrNoPad", err)
	}
	// A peer that sends PAD all the same: the link fails.
	ta := NewTrunk(true, HandlerFunc(dialHandler))
	c := Config{}
	ca, cb, ha, _ := handshaken(t, &c, 0, 1, header.FeatureTrunk)
	l := ta.Add(ca, c, ha, 0, false)
	defer l.Close()
	defer cb.Close()
	if _, err := cb.Write(header.AppendFrame(nil, header.TypePad, 0, make([]byte, 100))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if err := l.Err(); err == nil || !strings.Contains(err.Error(), "PAD") {
			t.Errorf("link ended with %v, want a protocol error about PAD", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("PAD from a peer without feature PAD accepted")
	}
}

// TestTrunkHoldExpress: while one side holds the express link
// (HoldExpress), its messages take the bulk link and arrive intact, the
// peer's messages still take the express link, and queue control counts
// the trunk as one without an express link; when the hold ends, messages
// take the express link again.
func TestTrunkHoldExpress(t *testing.T) {
	ta, tb, as, bs := trunkPair(t, Config{}, 1, true)
	app, _ := openVia(t, as[0], testnet.Echo(t, loopback))
	defer app.Close()
	app.SetDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, 64)
	pings := func(round byte) {
		t.Helper()
		for k := range 20 {
			msg := bytes.Repeat([]byte{round, byte(k)}, 32)
			if _, err := app.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("round %d message %d: echo %x, %v", round, k, got[:4], err)
			}
			time.Sleep(2 * burstGap)
		}
	}
	sent := func(ls []*Link) (bulk, x uint64) { return ls[0].Stats.BytesSent.Load(), ls[1].Stats.BytesSent.Load() }

	pings(1)
	if _, x := sent(as); x == 0 {
		t.Fatal("before the hold, no message took the express link")
	}
	ta.HoldExpress(time.Minute)
	if !ta.ExpressHeld(time.Now()) || tb.ExpressHeld(time.Now()) {
		t.Fatal("the hold is not on the near trunk alone")
	}
	var seen msgSeen
	if !ta.lastMessage(time.Now(), &seen).IsZero() {
		t.Error("queue control still hears of messages during the hold: it should stand aside")
	}
	b0, x0 := sent(as)
	_, px0 := sent(bs)
	pings(2)
	b1, x1 := sent(as)
	_, px1 := sent(bs)
	if x1 != x0 {
		t.Errorf("during the hold the express link sent %d more bytes", x1-x0)
	}
	if b1-b0 < 20*64 {
		t.Errorf("during the hold the bulk link sent %d bytes, want the 20 messages' %d at least", b1-b0, 20*64)
	}
	if px1-px0 < 20*64 {
		t.Errorf("the peer's echoes took its express link for %d bytes, want %d at least: a hold is one side's", px1-px0, 20*64)
	}
	ta.HoldExpress(0)
	if ta.lastMessage(time.Now(), &seen).IsZero() {
		t.Error("after the hold, queue control hears of no message on the express link")
	}
	pings(3)
	if _, x2 := sent(as); x2 == x1 {
		t.Error("after the hold, no message took the express link again")
	}
}

// TestTrunkNoStripe: with NoStripe, each stream's bulk stays on its home
// link in both directions (the bulk links other streams home carry none
// of it), and its messages still take the express link.
func TestTrunkNoStripe(t *testing.T) {
	_, _, as, bs := trunkPair(t, Config{Chunk: 32 << 10, Window: 512 << 10, NoStripe: true}, 3, true)
	echoStreams(t, as[1], 2, func(i int, app *net.TCPConn) error { return mixedEcho(app, byte(i)) })
	for i := range 3 {
		if i == 1 {
			continue
		}
		if a, b := as[i].Stats.BytesSent.Load(), bs[i].Stats.BytesSent.Load(); a != 0 || b != 0 {
			t.Errorf("bulk link %d, which homes no stream, carried %d and %d bytes", i, a, b)
		}
	}
	// The blocks, 2 streams x 12 rounds x 300 KiB, less the first bytes of
	// each burst, which may take the express link.
	if blocks := uint64(2 * 12 * 300 << 10); as[1].Stats.BytesSent.Load() < blocks*9/10 || bs[1].Stats.BytesSent.Load() < blocks*9/10 {
		t.Errorf("the home link carried %d and %d bytes, not the streams' blocks", as[1].Stats.BytesSent.Load(), bs[1].Stats.BytesSent.Load())
	}
	if as[3].Stats.BytesSent.Load() == 0 || bs[3].Stats.BytesSent.Load() == 0 {
		t.Error("no message took the express link")
	}
}
