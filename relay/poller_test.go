package relay

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestPollerForwards: in a ping-pong of small messages the poller thread
// does the forwarding on both gateways (it reads the quiet application's
// socket and the idle link), and Config.NoPoller turns it off.
func TestPollerForwards(t *testing.T) {
	const rounds = 200
	dst := testnet.Serve(t, loopback, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
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
	ca.(*net.TCPConn).SetWriteBuffer(4096)
	cb.(*net.TCPConn).SetReadBuffer(4096)
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
