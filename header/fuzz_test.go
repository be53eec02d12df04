package header

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to the
// same 12 bytes; the body parsers never panic on any payload.
func FuzzDecode(f *testing.F) {
	f.Add(enc(Header{Type: TypeData, Stream: 1, Length: 5}))
	f.Add(enc(Header{Type: TypeDataAt, Stream: 3, Length: 9}))
	f.Add(enc(Header{Type: TypeHalfClose, Stream: 3, Length: 4}))
	f.Add(enc(Header{Type: TypeHello, Length: 18}))
	f.Add(enc(Header{Type: TypeClamp, Length: 4}))
	f.Add(enc(Header{Type: TypeRetire}))
	f.Add(enc(Header{Type: TypeRenew}))
	f.Add(enc(Header{Type: TypePad, Length: 4096}))
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 14, 4, 0, 80, 10, 0, 0, 1, 4, 0, 81, 10, 0, 0, 2})
	f.Add(enc(Header{Type: TypeAck, Length: 8}))
	resume := Hello{SiteID: 1, LinkCount: 2, Features: FeatureTrunk | FeatureResume, MaxPayload: 1, Window: 1, Name: "a",
		Session: 9, Received: 1234, Resume: true}
	hb, _ := AppendHello(nil, &resume)
	f.Add(AppendFrame(nil, TypeHello, 0, hb))
	second := resume
	second.Gateway = 1 // a site's second gateway host (ExtGateway)
	hb, _ = AppendHello(nil, &second)
	f.Add(AppendFrame(nil, TypeHello, 0, hb))
	auto := second
	auto.Trunk, auto.TrunkAuto = TrunkParallel, true // ExtTrunk
	hb, _ = AppendHello(nil, &auto)
	f.Add(AppendFrame(nil, TypeHello, 0, hb))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b)
		if err == nil {
			if !bytes.Equal(enc(h), b[:Size]) {
				t.Fatalf("%+v re-encodes differently", h)
			}
			if h.Length > MaxPayload {
				t.Fatalf("accepted length %d", h.Length)
			}
		}
		var p []byte
		if len(b) > Size {
			p = b[Size:]
		}
		if hl, err := ParseHello(p); err == nil {
			if out, err := AppendHello(nil, &hl); err != nil || len(out) > len(p) {
				t.Fatalf("hello %+v re-encodes badly: %v", hl, err)
			}
		}
		if o, err := ParseOpen(p); err == nil {
			if _, err := AppendOpen(nil, &o); err != nil {
				t.Fatalf("open %+v does not re-encode: %v", o, err)
			}
		}
		ParsePeerQuery(p)
		ParsePeerReply(p)
		ParseEndpoint(p)
		DecodeCode(p)
		DecodeWindow(p)
		DecodeClamp(p)
		DecodeAck(p)
	})
}

// FuzzReader feeds arbitrary bytes, as a hostile peer would, to the frame
// Reader: it must end with an error or EOF after finitely many frames,
// never panic, and never hand out more payload than a header announced.
func FuzzReader(f *testing.F) {
	var s []byte
	s = AppendFrame(s, TypeData, 1, []byte("abc"))
	s = AppendFrame(s, TypeWindow, 1, []byte{0, 0, 0, 9})
	s = AppendFrame(s, TypePing, 0, []byte("pingping"))
	f.Add(s, uint16(16))
	f.Add(s[:20], uint16(0))
	f.Add([]byte{1, 5, 0, 0, 0, 0, 0, 1, 0x10, 0, 0, 0}, uint16(12))
	f.Fuzz(func(t *testing.T, data []byte, size uint16) {
		r := NewReader(bytes.NewReader(data), int(size))
		buf := make([]byte, 4096)
		total := 0
		for frames := 0; ; frames++ {
			if frames > len(data)/Size+1 {
				t.Fatalf("%d frames out of %d bytes", frames, len(data))
			}
			h, p, err := r.ReadFrame(buf)
			if err != nil {
				if err == io.EOF && total != len(data) {
					t.Fatalf("clean EOF after %d of %d bytes", total, len(data))
				}
				if errors.Is(err, ErrShort) {
					total += Size + int(h.Length)
					continue
				}
				return
			}
			if len(p) != int(h.Length) {
				t.Fatalf("payload %d for length %d", len(p), h.Length)
			}
			total += Size + len(p)
		}
	})
}

// FuzzReaderEventLoop reads the same bytes as an event loop does (the
// relay's poller thread): non-blocking FillFrom as bytes arrive in pieces,
// whole frames while FrameBuffered, and a blocking read of any frame left
// partial. It must see exactly the frames a plain blocking reader sees.
func FuzzReaderEventLoop(f *testing.F) {
	var s []byte
	s = AppendFrame(s, TypeData, 1, []byte("abc"))
	s = AppendFrame(s, TypeWindow, 1, []byte{0, 0, 0, 9})
	s = AppendFrame(s, TypeData, 3, bytes.Repeat([]byte{7}, 300))
	s = AppendFrame(s, TypePing, 0, []byte("pingping"))
	f.Add(s, uint16(64), uint64(1))
	f.Add(s, uint16(0), uint64(7))
	f.Add(s[:40], uint16(16), uint64(3))
	f.Fuzz(func(t *testing.T, data []byte, size uint16, seed uint64) {
		type fr struct {
			h Header
			p string
		}
		buf := make([]byte, 4096)
		// Bytes arrive in pieces of pseudo-random size; a non-blocking read
		// sees only what has arrived, a blocking one makes the next arrive.
		src := &arrivals{data: data, seed: seed | 1}
		r := NewReader(src, int(size))
		var q []fr     // frames the event loop handled, not yet returned
		var qerr error // and the error that stopped it
		next := func() (Header, []byte, error) {
			for len(q) == 0 && qerr == nil && r.Buffered() == 0 && r.Remaining() == 0 && src.pos < len(data) {
				src.arrive()
				for {
					room := r.Room()
					n, err := r.FillFrom(src.tryRead)
					if err == errAgain {
						break
					}
					for r.FrameBuffered() {
						src.loop = true // reading a buffered frame must not read
						h, p, err := r.ReadFrame(buf)
						src.loop = false
						if err != nil && !errors.Is(err, ErrShort) {
							qerr = err
							break
						}
						if err == nil {
							q = append(q, fr{h, string(p)})
						}
					}
					if qerr != nil || err != nil || n == 0 || n < room {
						break
					}
				}
			}
			if len(q) > 0 {
				f := q[0]
				q = q[1:]
				return f.h, []byte(f.p), nil
			}
			if qerr != nil {
				return Header{}, nil, qerr
			}
			return r.ReadFrame(buf) // blocking, as the goroutine the loop hands back to
		}
		var got []fr
		var gerr error
		for range len(data) + 2 {
			h, p, err := next()
			if errors.Is(err, ErrShort) {
				continue
			}
			if err != nil {
				gerr = err
				break
			}
			got = append(got, fr{h, string(p)})
		}
		// The plain reader skips ErrShort frames the same way.
		var want []fr
		var werr error
		pr := NewReader(bytes.NewReader(data), int(size))
		for {
			h, p, err := pr.ReadFrame(buf)
			if errors.Is(err, ErrShort) {
				continue
			}
			if err != nil {
				werr = err
				break
			}
			want = append(want, fr{h, string(p)})
		}
		if len(got) != len(want) {
			t.Fatalf("event loop read %d frames (%v), plain reader %d (%v)", len(got), gerr, len(want), werr)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("frame %d differs: %+v vs %+v", i, got[i].h, want[i].h)
			}
		}
		if (gerr == io.EOF) != (werr == io.EOF) {
			t.Fatalf("end: event loop %v, plain reader %v", gerr, werr)
		}
	})
}

var errAgain = errors.New("would block")

// arrivals is a byte stream that arrives piecewise.
type arrivals struct {
	data       []byte
	pos, avail int
	seed       uint64
	loop       bool // in the event loop: a blocking read is a bug
}

func (a *arrivals) arrive() {
	a.seed ^= a.seed << 13
	a.seed ^= a.seed >> 7
	a.seed ^= a.seed << 17
	a.avail = min(len(a.data), a.avail+1+int(a.seed%200))
}

func (a *arrivals) tryRead(b []byte) (int, error) {
	if a.pos == len(a.data) {
		return 0, io.EOF
	}
	if a.pos == a.avail {
		return 0, errAgain
	}
	n := copy(b, a.data[a.pos:a.avail])
	a.pos += n
	return n, nil
}

func (a *arrivals) Read(b []byte) (int, error) {
	if a.loop {
		panic("event loop: blocking read of a frame FrameBuffered called whole")
	}
	if a.pos == a.avail && a.pos < len(a.data) {
		a.arrive()
	}
	return a.tryRead(b)
}
