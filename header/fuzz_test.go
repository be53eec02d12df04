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
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 14, 4, 0, 80, 10, 0, 0, 1, 4, 0, 81, 10, 0, 0, 2})
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
