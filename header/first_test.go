package header

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// endless is a stream of zero bytes: a body as long as a peer declares.
type endless struct{}

func (endless) Read(p []byte) (int, error) { clear(p); return len(p), nil }

var firstTypes = []Type{TypeOpen, TypePeerQuery, TypeListen}

// TestReadFirst: a first frame of an allowed type is read exactly; one
// of any other type, whatever length it declares, is refused from its
// header, with none of its body read and the refusal naming the type,
// the length and what is allowed.
func TestReadFirst(t *testing.T) {
	body, err := AppendOpen(nil, &Open{Dst: netip.MustParseAddrPort("10.0.2.1:1024"), Src: netip.MustParseAddrPort("10.0.1.1:40000")})
	if err != nil {
		t.Fatal(err)
	}
	open := AppendFrame(nil, TypeOpen, 0, body)
	r := bytes.NewReader(append(append([]byte(nil), open...), "app bytes"...))
	h, p, err := ReadFirst(r, firstTypes...)
	if err != nil || h.Type != TypeOpen || !bytes.Equal(p, body) {
		t.Fatalf("ReadFirst = %v %x %v", h, p, err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "app bytes" {
		t.Errorf("read ahead: left %q", rest)
	}
	listen := AppendFrame(nil, TypeListen, 7, AppendListen(nil, 5000))
	if h, p, err := ReadFirst(bytes.NewReader(listen), firstTypes...); err != nil || h.Type != TypeListen || h.Stream != 7 || len(p) != 2 {
		t.Errorf("LISTEN: %v %x %v", h, p, err)
	}

	for _, tc := range []struct {
		t      Type
		stream uint32
		length uint32
	}{{TypePad, 0, MaxPayload}, {TypeData, 1, MaxPayload}, {TypeDataAt, 1, MaxPayload}, {TypeHello, 0, 64}, {TypePad, 0, 0}} {
		var hb [Size]byte
		Header{Type: tc.t, Stream: tc.stream, Length: tc.length}.Encode(hb[:])
		cr := &countingReader{r: io.MultiReader(bytes.NewReader(hb[:]), endless{})}
		h, p, err := ReadFirst(cr, firstTypes...)
		if !errors.Is(err, ErrUnexpected) || p != nil || h.Type != tc.t {
			t.Errorf("%v of %d bytes first: %v %v, want ErrUnexpected", tc.t, tc.length, h, err)
			continue
		}
		if cr.n != Size {
			t.Errorf("%v of %d bytes first: read %d bytes, want the header's %d", tc.t, tc.length, cr.n, Size)
		}
		for _, want := range []string{tc.t.String(), "declaring " + strconv.Itoa(int(tc.length)), "OPEN, PEER_QUERY or LISTEN", "4096"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: error %q does not say %q", tc.t, err, want)
			}
		}
	}

	// An allowed type above its own bound is refused by Decode, unread.
	var hb [Size]byte
	Header{Type: TypeOpen, Length: MaxControl + 1}.Encode(hb[:])
	cr := &countingReader{r: io.MultiReader(bytes.NewReader(hb[:]), endless{})}
	if _, _, err := ReadFirst(cr, firstTypes...); !errors.Is(err, ErrTooLarge) || cr.n != Size {
		t.Errorf("OPEN of %d bytes: %v after %d bytes, want ErrTooLarge after %d", MaxControl+1, err, cr.n, Size)
	}
	// A type allowed by the caller but longer than a control frame.
	Header{Type: TypePad, Length: MaxControl + 1}.Encode(hb[:])
	cr = &countingReader{r: io.MultiReader(bytes.NewReader(hb[:]), endless{})}
	if _, _, err := ReadFirst(cr, TypePad); !errors.Is(err, ErrTooLarge) || cr.n != Size || !strings.Contains(err.Error(), "limit 4096") {
		t.Errorf("PAD of %d bytes where PAD is allowed: %v after %d bytes, want ErrTooLarge after %d", MaxControl+1, err, cr.n, Size)
	}

	if _, _, err := ReadFirst(bytes.NewReader(open[:len(open)-2]), firstTypes...); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated body: %v", err)
	}
	if _, _, err := ReadFirst(bytes.NewReader(nil), firstTypes...); err != io.EOF {
		t.Errorf("empty: %v, want io.EOF", err)
	}
}
