package mx

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/mx/wire"
)

// scriptLink is the engine's link in FuzzChannel: the test injects each
// frame and waits until the engine asks for the next one, so a frame has
// been handled whole (notes included) before the script goes on; what the
// engine sends is kept.
type scriptLink struct {
	in    chan []byte
	ready chan struct{} // the engine is back in Recv
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	out   [][]byte
}

var macX = MAC{2, 0, 0, 0, 0, 0x66}

func (l *scriptLink) MAC() MAC { return macA }
func (l *scriptLink) MTU() int { return 1500 }
func (l *scriptLink) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *scriptLink) Send(b []byte) error {
	l.mu.Lock()
	l.out = append(l.out, append([]byte(nil), b...))
	l.mu.Unlock()
	return nil
}

func (l *scriptLink) Recv(buf []byte) (int, error) {
	select {
	case l.ready <- struct{}{}:
	case <-l.done:
		return 0, errClosed
	}
	select {
	case b := <-l.in:
		return copy(buf, b), nil
	case <-l.done:
		return 0, errClosed
	}
}

func (l *scriptLink) sent() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.out
	l.out = nil
	return out
}

// script hands out the fuzzer's bytes; past the end, zeros.
type script []byte

func (s *script) byte() byte {
	if len(*s) == 0 {
		return 0
	}
	b := (*s)[0]
	*s = (*s)[1:]
	return b
}

func (s *script) u16() uint16 { return uint16(s.byte())<<8 | uint16(s.byte()) }
func (s *script) u32() uint32 { return uint32(s.u16())<<16 | uint32(s.u16()) }
func (s *script) bytes(n int) []byte {
	n = min(n, len(*s))
	b := (*s)[:n]
	*s = (*s)[n:]
	return b
}

// FuzzChannel plays a peer endpoint that sends an engine's endpoint
// sequences of frames built from the fuzzer's bytes — CONNECTs, sequenced
// frames near the expected sequence number with the sessions, message ids
// and rendezvous handles the engine uses, acknowledgements of what it
// sent, REJECTs, raw headers — while the engine's side sends messages,
// posts receives, dials and accepts streams, reads and writes them, and
// its clock runs. The engine must not panic or wedge; its buffer pools
// must never hold a buffer twice or more buffers than they own, a
// channel holds at most a window of early frames, a receive never
// reports more bytes than its buffer; once the endpoint closes, every
// request and stream call ends and every buffer is back in its pool.
func FuzzChannel(f *testing.F) {
	// Ops: a byte mod 10 (0, 1 CONNECT or CONNECT_ACK, 2 sequenced frame,
	// 3 ACK/NACK, 4 clock, 5 engine call, 6 raw header, 7 REJECT, 8 stream
	// message, 9 PULL/DATA/DONE for a rendezvous), the window x
	// advertises, then the op's own bytes.
	for _, sc := range channelSeeds() {
		f.Add(sc)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		clk := &fakeClock{now: time.Unix(1e9, 0)}
		cfg := Config{Clock: clk, Window: 8, Buffers: 24, EagerMax: 1024, PullBlock: 700, PullAhead: 2,
			KeepAlive: 50 * time.Millisecond, PeerTimeout: 200 * time.Millisecond}
		link := &scriptLink{in: make(chan []byte), ready: make(chan struct{}), done: make(chan struct{})}
		e, err := New(link, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		ep, err := e.Open(1)
		if err != nil {
			t.Fatal(err)
		}
		x := Addr{MAC: macX, EP: 7}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var (
			wg      sync.WaitGroup
			reqs    []*Request
			mu      sync.Mutex
			streams []*Stream
		)
		addStream := func(s *Stream) {
			mu.Lock()
			streams = append(streams, s)
			mu.Unlock()
		}
		stream := func(i byte) *Stream {
			mu.Lock()
			defer mu.Unlock()
			if len(streams) == 0 {
				return nil
			}
			return streams[int(i)%len(streams)]
		}
		ln, _ := Listen(ep, StreamConfig{Chunk: 1500, Window: 4000})

		// What the engine told x: its session, next sequence number, the
		// handles of its RTS, and its last PULL.
		var aSession, aNext, xSeq, xSession uint32
		var rts, pull wire.Header
		learn := func() {
			for _, b := range link.sent() {
				h, err := wire.Decode(b[wire.EthSize:])
				if err != nil {
					t.Fatalf("engine sent a frame it cannot decode: %v", err)
				}
				switch {
				case h.Type == wire.TypeConnect || h.Type == wire.TypeConnectAck:
					aSession = h.Session
				case h.Type == wire.TypeRTS:
					rts = h
				case h.Type == wire.TypePull:
					pull = h
				}
				if h.Type.Sequenced() && !wire.SeqLess(h.Seq+1, aNext) {
					aNext = h.Seq + 1
				}
			}
		}
		// inject hands the engine one frame from x and waits until it
		// has handled it.
		inject := func(h wire.Header, payload []byte) {
			b := make([]byte, wire.EthSize+wire.Size+len(payload))
			putEth(b, macA, macX)
			h.Len = uint16(len(payload))
			h.Encode(b[wire.EthSize:])
			copy(b[wire.EthSize+wire.Size:], payload)
			deliver(t, link, b)
		}
		<-link.ready
		s := script(data)
		for op := 0; len(s) > 0 && op < 300; op++ {
			learn()
			op := s.byte() % 10
			base := wire.Header{Dst: 1, Src: x.EP, Session: xSession, Ack: aNext, Window: uint16(s.byte() % 16)}
			switch op {
			case 0, 1: // CONNECT, CONNECT_ACK
				h := base
				h.Type, h.Ack = wire.TypeConnect, 0
				if s.byte()%2 == 1 {
					h.Type, h.Ack = wire.TypeConnectAck, aSession
				}
				xSession++
				if s.byte()%4 == 0 {
					xSession-- // the same session again
				}
				h.Session, xSeq = xSession, 0
				inject(h, wire.AppendConnect(nil, wire.Connect{MaxFrame: 49 + s.u16()%1500}))
			case 2: // a sequenced frame
				h := base
				h.Type = []wire.Type{wire.TypeEager, wire.TypeRTS, wire.TypePull, wire.TypeData, wire.TypeDone, wire.TypeDisconnect}[s.byte()%6]
				h.Seq = xSeq + uint32(int8(s.byte()))/32
				h.Flags = s.byte() & wire.FlagAckNow
				h.Match, h.Msg, h.MsgLen, h.Offset = uint64(s.byte()%4), uint32(s.byte()%4), uint32(s.u16()), uint32(s.u16()%2048)
				var p []byte
				switch h.Type {
				case wire.TypeEager, wire.TypeData:
					p = s.bytes(int(s.u16() % 1500))
				case wire.TypeDisconnect, wire.TypeDone:
					h.Match, h.MsgLen, h.Offset = 0, 0, 0
				}
				if h.Type == wire.TypeRTS || h.Type == wire.TypePull {
					h.Offset = 0
				}
				if h.Seq == xSeq {
					xSeq++
				}
				inject(h, p)
			case 3: // ACK or NACK of what the engine sent
				h := base
				h.Type = wire.TypeAck
				if s.byte()%2 == 1 {
					h.Type = wire.TypeNack
				}
				h.Ack = aNext - uint32(s.byte()%8)
				h.Sack = uint32(s.byte())
				h.Flags = s.byte() & wire.FlagAckNow
				inject(h, nil)
			case 4: // time passes
				d := time.Duration(s.byte()) * 20 * time.Microsecond
				if s.byte()%8 == 0 {
					d = time.Duration(s.byte()) * 5 * time.Millisecond
				}
				clk.Advance(d)
			case 5: // the engine's side does something
				switch s.byte() % 8 {
				case 0:
					wg.Add(1)
					go func() { defer wg.Done(); ep.Connect(ctx, x) }()
					settle(e, func() bool { return ep.chans[x] != nil })
				case 1:
					if r, err := ep.Isend(x, uint64(s.byte()), make([]byte, int(s.u16()%3000))); err == nil {
						reqs = append(reqs, r)
					}
				case 2:
					reqs = append(reqs, ep.Irecv(make([]byte, int(s.u16()%3000)), uint64(s.byte()%4), uint64(s.byte()%4)))
				case 3:
					wg.Add(1)
					go func() {
						defer wg.Done()
						if st, err := Dial(ctx, ep, x, []byte("meta"), StreamConfig{Chunk: 1500, Window: 4000}); err == nil {
							addStream(st)
						}
					}()
					settle(e, func() bool { return ep.chans[x] != nil })
				case 4:
					wg.Add(1)
					posted := ep.postedCount()
					go func() {
						defer wg.Done()
						if st, err := ln.Accept(ctx); err == nil {
							addStream(st)
						}
					}()
					settle(e, func() bool { return ep.postedCount() != posted })
				case 5:
					if st := stream(s.byte()); st != nil {
						wg.Add(1)
						n := int(s.u16() % 5000)
						go func() { defer wg.Done(); st.Write(make([]byte, n)) }()
					}
				case 6:
					if st := stream(s.byte()); st != nil {
						b := make([]byte, int(s.u16()%5000))
						if n, _ := st.TryRead(b); n > len(b) {
							t.Fatalf("stream read %d bytes into %d", n, len(b))
						}
					}
				case 7:
					if st := stream(s.byte()); st != nil {
						switch s.byte() % 3 {
						case 0:
							wg.Add(1)
							go func() { defer wg.Done(); st.CloseWrite() }()
						case 1:
							st.Abort()
						case 2:
							wg.Add(1)
							go func() { defer wg.Done(); st.Close() }()
						}
					}
				}
			case 6: // any header at all, from x
				b := make([]byte, wire.EthSize+wire.Size)
				putEth(b, macA, macX)
				copy(b[wire.EthSize:], s.bytes(wire.Size))
				b[wire.EthSize] = wire.Version
				b = append(b, s.bytes(int(s.byte()))...)
				deliver(t, link, b)
			case 7: // REJECT
				h := base
				h.Type, h.Ack, h.Window = wire.TypeReject, 0, 0
				h.Session = aSession + uint32(s.byte()%2)
				inject(h, []byte{s.byte() % 5})
			case 8: // a stream message: open, data, credit or reset
				h := base
				h.Type, h.Seq = wire.TypeEager, xSeq
				id := uint64(s.byte() % 4)
				h.Match = streamMatch(id, s.byte()%2 == 0, uint64(s.byte()%4))
				h.Msg = s.u32()
				p := s.bytes(int(s.u16() % 1200))
				h.MsgLen = uint32(len(p))
				xSeq++
				inject(h, p)
			case 9: // the rendezvous the engine started: PULL it, or answer its PULL
				h := base
				h.Seq = xSeq
				switch s.byte() % 3 {
				case 0:
					h.Type, h.Msg, h.Offset, h.MsgLen = wire.TypePull, rts.Msg, uint32(s.u16()), max(1, uint32(s.u16()))
				case 1:
					h.Type, h.Msg, h.MsgLen = wire.TypeData, pull.Msg, rts.MsgLen
					h.Offset = pull.Offset + uint32(s.u16()%1024)
					p := s.bytes(int(1 + s.u16()%1400))
					xSeq++
					inject(h, p)
					continue
				case 2:
					h.Type, h.Msg = wire.TypeDone, rts.Msg
				}
				xSeq++
				inject(h, nil)
			}
			checkEngine(t, e)
		}
		learn()
		ep.Close()
		cancel()
		mu.Lock()
		for _, st := range streams {
			st.Abort()
		}
		mu.Unlock()
		waited := make(chan struct{})
		go func() { wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			t.Fatal("a stream or connect call does not return after its endpoint closed")
		}
		for _, r := range reqs {
			select {
			case <-r.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a request is still pending after its endpoint closed")
			}
			if r.recv && r.n > len(r.buf) {
				t.Fatalf("receive of %d bytes into %d", r.n, len(r.buf))
			}
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		// The receive goroutine holds one receive buffer while it waits.
		if n := len(e.rx.free); n < cfg.Buffers-1 || len(e.tx.free) != cfg.Buffers {
			t.Fatalf("after close: %d of %d receive and %d send buffers free", n, cfg.Buffers, len(e.tx.free))
		}
	})
}

// deliver hands the engine one frame and waits until it has handled it.
func deliver(t *testing.T, l *scriptLink, b []byte) {
	t.Helper()
	select {
	case l.in <- b:
	case <-time.After(5 * time.Second):
		t.Fatal("engine does not take a frame")
	}
	select {
	case <-l.ready:
	case <-time.After(5 * time.Second):
		t.Fatal("engine wedged handling a frame")
	}
}

// checkEngine checks invariants that hold between frames.
func checkEngine(t *testing.T, e *Engine) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range []*pool{e.rx, e.tx} {
		if len(p.free) > e.cfg.Buffers {
			t.Fatalf("a pool holds %d buffers of %d", len(p.free), e.cfg.Buffers)
		}
		seen := make(map[*byte]bool, len(p.free))
		for _, b := range p.free {
			if seen[&b[0]] {
				t.Fatal("a pool holds one buffer twice")
			}
			seen[&b[0]] = true
		}
	}
	for _, ep := range e.eps {
		for _, ch := range ep.chans {
			if len(ch.ooo) >= e.cfg.Window {
				t.Fatalf("channel holds %d early frames, window %d", len(ch.ooo), e.cfg.Window)
			}
			if wire.SeqLess(ch.sndNext, ch.sndUna) {
				t.Fatalf("channel acknowledged %d beyond what it sent (%d)", ch.sndUna, ch.sndNext)
			}
		}
	}
}

// settle waits a little for a call on another goroutine to reach the
// engine (cond, under the engine's lock), to keep a script's runs alike.
func settle(e *Engine, cond func() bool) {
	for range 200 {
		e.mu.Lock()
		ok := cond()
		e.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// seedScript writes FuzzChannel's ops in the order it reads them.
type seedScript []byte

func (s *seedScript) op(op, window byte, b ...byte) *seedScript {
	*s = append(append(*s, op, window), b...)
	return s
}
func u16(v int) []byte { return []byte{byte(v >> 8), byte(v)} }
func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func (s *seedScript) connect() *seedScript { return s.op(0, 8, cat([]byte{0, 1}, u16(1450))...) }
func (s *seedScript) connectAck() *seedScript {
	return s.op(1, 8, cat([]byte{1, 1}, u16(1450))...)
}

// seq sends a sequenced frame: t indexes EAGER, RTS, PULL, DATA, DONE,
// DISCONNECT; delta is 32 per sequence number ahead.
func (s *seedScript) seq(t, delta, match, msg byte, msglen, off int, p []byte) *seedScript {
	b := cat([]byte{t, delta, 0, match, msg}, u16(msglen), u16(off))
	if t == 0 || t == 3 {
		b = cat(b, u16(len(p)), p)
	}
	return s.op(2, 8, b...)
}
func (s *seedScript) ack(back, sack byte) *seedScript { return s.op(3, 8, 0, back, sack, 0) }
func (s *seedScript) clock(ms int) *seedScript        { return s.op(4, 8, 0, 0, byte(ms/5)) }
func (s *seedScript) call(b ...byte) *seedScript      { return s.op(5, 8, b...) }
func (s *seedScript) streamMsg(id, dialer, kind byte, p []byte) *seedScript {
	return s.op(8, 8, cat([]byte{id, dialer, kind, 0, 0, 0, byte(len(*s))}, u16(len(p)), p)...)
}

func channelSeeds() [][]byte {
	hello := []byte("hello, rank")
	credit := []byte{0, 0, 0x10, 0}
	var seeds []*seedScript
	add := func() *seedScript { s := &seedScript{}; seeds = append(seeds, s); return s }
	// The peer connects and sends a message the engine has a receive for.
	add().connect().call(cat([]byte{2}, u16(100), []byte{1, 3})...).seq(0, 0, 1, 0, len(hello), 0, hello).ack(0, 0)
	// Unexpected first, then the receive; a duplicate; one early frame.
	add().connect().seq(0, 0, 2, 0, len(hello), 0, hello).seq(0, 0xe0, 2, 1, 5, 0, hello[:5]).
		seq(0, 32, 2, 3, 4, 0, hello[:4]).call(cat([]byte{2}, u16(5), []byte{0, 0})...).seq(0, 0, 2, 2, 3, 0, hello[:3])
	// The engine connects and sends eagerly and by rendezvous; the
	// peer acknowledges, pulls, and is done.
	add().call(0).connectAck().call(cat([]byte{1, 1}, u16(300))...).call(cat([]byte{1, 2}, u16(2500))...).ack(0, 0).
		op(9, 8, cat([]byte{0}, u16(0), u16(2500))...).ack(0, 0).clock(1).ack(0, 0).op(9, 8, 2).ack(0, 0)
	// The peer sends by rendezvous; the engine pulls; DATA answers.
	add().connect().call(cat([]byte{2}, u16(2000), []byte{0, 0})...).seq(1, 0, 1, 0, 1800, 0, nil).
		op(9, 8, cat([]byte{1}, u16(0), u16(700), make([]byte, 700))...).
		op(9, 8, cat([]byte{1}, u16(700), u16(700), make([]byte, 700))...).ack(0, 0)
	// Streams: accepted, data, credit, read, write, reset.
	add().call(4).connect().streamMsg(1, 0, kindOpen, []byte("meta")).streamMsg(1, 0, kindData, hello).
		call(6, 0, 0, 100).streamMsg(1, 0, kindCredit, credit).call(cat([]byte{5, 0}, u16(3000))...).ack(0, 0).
		streamMsg(1, 0, kindReset, nil).call(6, 0, 0, 100)
	// A dialed stream, the peer goes silent: keepalive, then timeout.
	add().call(3).connectAck().ack(0, 0).streamMsg(1, 1, kindCredit, credit).call(cat([]byte{5, 0}, u16(2000))...).
		clock(60).clock(300).call(6, 0, 0, 10)
	// The peer restarts (a new session), REJECTs, disconnects.
	add().connect().seq(0, 0, 0, 0, 1, 0, hello[:1]).connect().op(7, 0, 0, 2).connect().seq(5, 0, 0, 0, 0, 0, nil)
	// Raw headers.
	add().connect().op(6, 0, cat(make([]byte, 4), []byte{0, 1, 0, 7}, make([]byte, 40), []byte{0})...)
	out := make([][]byte, len(seeds))
	for i, s := range seeds {
		out[i] = *s
	}
	return out
}
