package header

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"testing/quick"
)

func enc(h Header) []byte {
	b := make([]byte, Size)
	h.Encode(b)
	return b
}

func TestEncodeLayout(t *testing.T) {
	got := enc(Header{Type: TypeData, Stream: 0x01020304, Length: 0x00010000})
	want := []byte{1, 5, 0, 0, 1, 2, 3, 4, 0, 1, 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded % x, want % x", got, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name string
		b    []byte
		err  error
	}{
		{"short", []byte{1, 5, 0}, ErrShort},
		{"version 0", []byte{0, 5, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}, ErrVersion},
		{"version 2", []byte{2, 5, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}, ErrVersion},
		{"type 0", []byte{1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}, ErrType},
		{"ack of 1 byte", []byte{1, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, ErrPayload},
		{"ack on a stream", enc(Header{Type: TypeAck, Stream: 5, Length: 8}), ErrStream},
		{"type 22", []byte{1, 22, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}, ErrType},
		{"open reply on a stream", enc(Header{Type: TypeOpenReply, Stream: 1, Length: 1}), ErrStream},
		{"open reply empty", enc(Header{Type: TypeOpenReply}), ErrPayload},
		{"listen of 4 bytes", enc(Header{Type: TypeListen, Stream: 1, Length: 4}), ErrPayload},
		{"listen reply empty", enc(Header{Type: TypeListenReply, Stream: 1}), ErrPayload},
		{"pad on a stream", enc(Header{Type: TypePad, Stream: 3, Length: 100}), ErrStream},
		{"pad above MaxPayload", enc(Header{Type: TypePad, Length: MaxPayload + 1}), ErrTooLarge},
		{"retire with a body", enc(Header{Type: TypeRetire, Length: 1}), ErrPayload},
		{"retire on a stream", enc(Header{Type: TypeRetire, Stream: 1}), ErrStream},
		{"renew with a body", enc(Header{Type: TypeRenew, Length: 4}), ErrPayload},
		{"renew on a stream", enc(Header{Type: TypeRenew, Stream: 2}), ErrStream},
		{"data at without payload", enc(Header{Type: TypeDataAt, Stream: 1, Length: 4}), ErrPayload},
		{"data at on stream 0", enc(Header{Type: TypeDataAt, Length: 9}), ErrStream},
		{"clamp on a stream", enc(Header{Type: TypeClamp, Stream: 1, Length: 4}), ErrStream},
		{"clamp of 8 bytes", enc(Header{Type: TypeClamp, Length: 8}), ErrPayload},
		{"half close 3 bytes", enc(Header{Type: TypeHalfClose, Stream: 1, Length: 3}), ErrPayload},
		{"half close 5 bytes", enc(Header{Type: TypeHalfClose, Stream: 1, Length: 5}), ErrPayload},
		{"seq flag", []byte{1, 5, 0x80, 0, 0, 0, 0, 1, 0, 0, 0, 1}, ErrFlags},
		{"low flag", []byte{1, 5, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1}, ErrFlags},
		{"data too large", enc(Header{Type: TypeData, Stream: 1, Length: MaxPayload + 1}), ErrTooLarge},
		{"data empty", enc(Header{Type: TypeData, Stream: 1}), ErrPayload},
		{"open too large", enc(Header{Type: TypeOpen, Stream: 1, Length: MaxControl + 1}), ErrTooLarge},
		{"window 5 bytes", enc(Header{Type: TypeWindow, Stream: 1, Length: 5}), ErrPayload},
		{"window huge", enc(Header{Type: TypeWindow, Stream: 1, Length: 1 << 30}), ErrTooLarge},
		{"half close body", enc(Header{Type: TypeHalfClose, Stream: 1, Length: 1}), ErrPayload},
		{"ping 7", enc(Header{Type: TypePing, Length: 7}), ErrPayload},
		{"hello short", enc(Header{Type: TypeHello, Length: 12}), ErrPayload},
		{"hello on stream", enc(Header{Type: TypeHello, Stream: 3, Length: 20}), ErrStream},
		{"data on stream 0", enc(Header{Type: TypeData, Length: 20}), ErrStream},
		{"reset on stream 0", enc(Header{Type: TypeReset, Length: 4}), ErrStream},
		{"peer query long", enc(Header{Type: TypePeerQuery, Stream: 1, Length: 39}), ErrPayload},
	}
	for _, c := range cases {
		_, err := Decode(c.b)
		if !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
	}
}

func TestDecodeAccepts(t *testing.T) {
	for _, h := range []Header{
		{Type: TypeOpen, Stream: 0, Length: 14}, // LAN open
		{Type: TypeOpen, Stream: 7, Length: 38}, // WAN open
		{Type: TypeOpenOK, Stream: 2},           // empty
		{Type: TypeData, Stream: 1, Length: 1},  // smallest data
		{Type: TypeData, Stream: 9, Length: MaxPayload},
		{Type: TypeDataAt, Stream: 9, Length: 5},    // offset + 1 byte
		{Type: TypeHalfClose, Stream: 9},            // plain
		{Type: TypeHalfClose, Stream: 9, Length: 4}, // with its final offset
		{Type: TypePing, Length: 8},
		{Type: TypeClamp, Length: 4},
		{Type: TypeRetire},
		{Type: TypeRenew},
		{Type: TypePad},
		{Type: TypePad, Length: MaxPayload},
		{Type: TypePeerReply, Stream: 0, Length: 9},
		{Type: TypeListen, Stream: 7, Length: 2},
		{Type: TypeListenReply, Stream: 7, Length: 1},
	} {
		got, err := Decode(enc(h))
		if err != nil || got != h {
			t.Errorf("%+v: got %+v, %v", h, got, err)
		}
	}
}

// randomHeader draws a header that Decode must accept.
func randomHeader(r *rand.Rand) Header {
	t := Type(1 + r.IntN(len(types)-1))
	for !t.known() { // reserved
		t = Type(1 + r.IntN(len(types)-1))
	}
	lo, hi := types[t].min, types[t].max
	h := Header{Type: t, Length: lo + uint32(r.Int64N(int64(hi-lo)+1))}
	if t == TypeHalfClose {
		h.Length = 4 * r.Uint32N(2)
	}
	if types[t].stream != linkOnly {
		h.Stream = 1 + r.Uint32N(1<<31)
	}
	return h
}

// TestRoundTripProperty: every valid header survives Encode/Decode, and
// every 12-byte string either decodes to a header that re-encodes to the same
// bytes or is rejected.
func TestRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		h := randomHeader(r)
		got, err := Decode(enc(h))
		if err != nil || got != h {
			t.Fatalf("%+v: decoded %+v, %v", h, got, err)
		}
	}
	f := func(b [Size]byte) bool {
		h, err := Decode(b[:])
		if err != nil {
			return true
		}
		return bytes.Equal(enc(h), b[:])
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 100000}); err != nil {
		t.Fatal(err)
	}
}

func TestEndpoints(t *testing.T) {
	for _, s := range []string{"10.1.2.3:80", "[2001:db8::1]:65535", "0.0.0.0:0"} {
		ap := netip.MustParseAddrPort(s)
		var b [19]byte
		n, err := PutEndpoint(b[:], ap)
		if err != nil || n != EndpointLen(ap) {
			t.Fatalf("%s: %d %v", s, n, err)
		}
		got, m, err := ParseEndpoint(b[:n])
		if err != nil || m != n || got != ap {
			t.Fatalf("%s: got %v %d %v", s, got, m, err)
		}
	}
	// IPv4-mapped IPv6 is sent as IPv4.
	var b [19]byte
	n, _ := PutEndpoint(b[:], netip.MustParseAddrPort("[::ffff:10.0.0.1]:5"))
	if got, _, _ := ParseEndpoint(b[:n]); n != 7 || got.String() != "10.0.0.1:5" {
		t.Fatalf("mapped: %d %v", n, got)
	}
	if _, err := PutEndpoint(b[:6], netip.MustParseAddrPort("1.2.3.4:5")); !errors.Is(err, ErrShort) {
		t.Fatalf("short put: %v", err)
	}
	for _, bad := range [][]byte{{}, {5, 0, 1, 1, 2, 3, 4}, {4, 0, 1, 1, 2, 3}, {6, 0, 1, 1, 2, 3, 4}} {
		if _, _, err := ParseEndpoint(bad); !errors.Is(err, ErrPayload) {
			t.Errorf("% x: %v", bad, err)
		}
	}
}

func TestHello(t *testing.T) {
	h := Hello{SiteID: 3, LinkIndex: 1, LinkCount: 2, Features: FeatureTrunk | FeatureExpress,
		MaxPayload: 128 << 10, Window: 4 << 20, Name: "nancy"}
	b, err := AppendHello(nil, &h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseHello(b)
	if err != nil || got != h {
		t.Fatalf("got %+v %v", got, err)
	}
	// Unknown non-critical extension skipped, critical rejected.
	if _, err := ParseHello(appendExt(bytes.Clone(b), 77, []byte("x"))); err != nil {
		t.Fatalf("non-critical: %v", err)
	}
	if _, err := ParseHello(appendExt(bytes.Clone(b), ExtCritical|77, nil)); !errors.Is(err, ErrCritical) {
		t.Fatalf("critical: %v", err)
	}
	if _, err := ParseHello(append(bytes.Clone(b), 0, 1, 0)); !errors.Is(err, ErrPayload) {
		t.Fatalf("truncated ext: %v", err)
	}
	for _, bad := range []Hello{
		{LinkCount: 1, MaxPayload: 1, Window: 1, Name: "a"},
		{SiteID: 1, LinkIndex: 1, LinkCount: 1, MaxPayload: 1, Window: 1, Name: "a"},
		{SiteID: 1, LinkCount: 1, MaxPayload: MaxPayload + 1, Window: 1, Name: "a"},
		{SiteID: 1, LinkCount: 1, MaxPayload: 1, Name: "a"},
		{SiteID: 1, LinkCount: 1, MaxPayload: 1, Window: 1},
		{SiteID: 1, LinkCount: 1, MaxPayload: 1, Window: 1, Name: "a", Resume: true}, // resume without a session
		{SiteID: 1, LinkCount: 2, Features: FeatureExpress, MaxPayload: 1, Window: 1, Name: "a"},
		{SiteID: 1, LinkCount: 1, Features: FeatureTrunk | FeatureExpress, MaxPayload: 1, Window: 1, Name: "a"},
		{SiteID: 1, LinkCount: 2, Features: FeatureTrunk | FeatureRenew, MaxPayload: 1, Window: 1, Name: "a"},
		// A renewal that does not resume, and one without feature RENEW.
		{SiteID: 1, LinkCount: 2, Features: FeatureTrunk | FeatureExpress | FeatureRenew | FeatureResume, MaxPayload: 1, Window: 1, Name: "a", Session: 7, Renew: true},
		{SiteID: 1, LinkCount: 2, Features: FeatureTrunk | FeatureResume, MaxPayload: 1, Window: 1, Name: "a", Session: 7, Resume: true, Renew: true},
	} {
		if _, err := AppendHello(nil, &bad); !errors.Is(err, ErrPayload) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	// The session extension: resuming and fresh, and malformed.
	for _, sh := range []Hello{
		{SiteID: 2, LinkCount: 3, Features: FeatureTrunk | FeatureResume, MaxPayload: 1, Window: 1, Name: "lyon", Session: 1 << 60},
		{SiteID: 2, LinkCount: 3, Features: FeatureTrunk | FeatureResume, MaxPayload: 1, Window: 1, Name: "lyon", Session: 7, Received: 1 << 40, Resume: true},
		{SiteID: 2, LinkCount: 3, Features: FeatureTrunk | FeatureExpress | FeatureRenew | FeatureResume, MaxPayload: 1, Window: 1, Name: "lyon",
			Session: 7, Received: 1 << 40, Resume: true, Renew: true},
	} {
		sb, err := AppendHello(nil, &sh)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ParseHello(sb); err != nil || got != sh {
			t.Fatalf("session: got %+v %v, want %+v", got, err, sh)
		}
		for _, f := range []byte{2, 4} { // renew without resume, an undefined flag
			sb[len(sb)-1] = f
			if _, err := ParseHello(sb); !errors.Is(err, ErrPayload) {
				t.Fatalf("session flag %d: %v", f, err)
			}
		}
	}
	// The gateway extension: a site's second gateway host, and malformed.
	gh := Hello{SiteID: 2, LinkCount: 1, MaxPayload: 1, Window: 1, Name: "lyon", Gateway: 3}
	gb, err := AppendHello(nil, &gh)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseHello(gb); err != nil || got != gh {
		t.Fatalf("gateway: got %+v %v, want %+v", got, err, gh)
	}
	for _, v := range [][]byte{{0}, {MaxGatewayIndex + 1}, {1, 1}, nil} {
		if _, err := ParseHello(appendExt(bytes.Clone(b), ExtGateway, v)); !errors.Is(err, ErrPayload) {
			t.Errorf("gateway extension %x: %v", v, err)
		}
	}
	if _, err := AppendHello(nil, &Hello{SiteID: 1, LinkCount: 1, MaxPayload: 1, Window: 1, Name: "a", Gateway: MaxGatewayIndex + 1}); !errors.Is(err, ErrPayload) {
		t.Errorf("gateway index %d: %v", MaxGatewayIndex+1, err)
	}
	// The trunk extension: each preset, fixed and auto, and malformed.
	for _, th := range []Hello{{Trunk: TrunkShared}, {Trunk: TrunkParallel}, {Trunk: TrunkShared, TrunkAuto: true}, {Trunk: TrunkParallel, TrunkAuto: true}} {
		th.SiteID, th.LinkCount, th.MaxPayload, th.Window, th.Name = 2, 1, 1, 1, "lyon"
		tb, err := AppendHello(nil, &th)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ParseHello(tb); err != nil || got != th {
			t.Fatalf("trunk: got %+v %v, want %+v", got, err, th)
		}
	}
	for _, v := range [][]byte{{0}, {3}, {0x80}, {0x81, 0}, {0x41}, nil} {
		if _, err := ParseHello(appendExt(bytes.Clone(b), ExtTrunk, v)); !errors.Is(err, ErrPayload) {
			t.Errorf("trunk extension %x: %v", v, err)
		}
	}
	for _, th := range []Hello{{Trunk: 3}, {TrunkAuto: true}} {
		th.SiteID, th.LinkCount, th.MaxPayload, th.Window, th.Name = 1, 1, 1, 1, "a"
		if _, err := AppendHello(nil, &th); !errors.Is(err, ErrPayload) {
			t.Errorf("trunk %d auto %v: %v", th.Trunk, th.TrunkAuto, err)
		}
	}
	zero := appendExt(bytes.Clone(b), ExtSession, make([]byte, sessionLen))
	if _, err := ParseHello(zero); !errors.Is(err, ErrPayload) {
		t.Fatalf("session 0: %v", err)
	}
	if _, err := ParseHello(appendExt(bytes.Clone(b), ExtSession, make([]byte, 9))); !errors.Is(err, ErrPayload) {
		t.Fatalf("short session: %v", err)
	}
	b[12] = 200 // name longer than the body
	if _, err := ParseHello(b); !errors.Is(err, ErrPayload) {
		t.Fatalf("long name: %v", err)
	}
}

func TestOpen(t *testing.T) {
	for _, o := range []Open{
		{Dst: netip.MustParseAddrPort("10.2.0.5:1024"), Src: netip.MustParseAddrPort("10.1.0.7:40000")},
		{Dst: netip.MustParseAddrPort("[fd00::2]:1"), Src: netip.MustParseAddrPort("10.1.0.7:2"), Label: "rank 3 pid 1234"},
		{Dst: netip.MustParseAddrPort("10.2.0.5:1024"), Src: netip.MustParseAddrPort("10.1.0.7:40000"), Resume: ResumeID{15: 9}},
	} {
		b, err := AppendOpen(nil, &o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseOpen(b)
		if err != nil || got != o {
			t.Fatalf("got %+v %v", got, err)
		}
		if _, err := ParseOpen(b[:len(b)-1]); err == nil {
			t.Fatalf("truncated open accepted")
		}
	}
	long := Open{Dst: netip.MustParseAddrPort("1.1.1.1:1"), Src: netip.MustParseAddrPort("1.1.1.2:1"), Label: string(make([]byte, 65))}
	if _, err := AppendOpen(nil, &long); !errors.Is(err, ErrPayload) {
		t.Fatal("long label accepted")
	}
	if _, err := AppendOpen(nil, &Open{}); !errors.Is(err, ErrPayload) {
		t.Fatal("zero endpoints accepted")
	}
	plain, _ := AppendOpen(nil, &Open{Dst: long.Dst, Src: long.Src})
	for _, v := range [][]byte{make([]byte, 16), make([]byte, 15), nil} {
		if _, err := ParseOpen(appendExt(bytes.Clone(plain), ExtResume, v)); !errors.Is(err, ErrPayload) {
			t.Errorf("resume id %x accepted: %v", v, err)
		}
	}
}

func TestStreamMeta(t *testing.T) {
	from, to := netip.MustParseAddrPort("10.1.0.1:40000"), netip.MustParseAddrPort("10.1.0.7:1024")
	for _, id := range []ResumeID{{}, {0: 1, 15: 2}} {
		b, err := AppendStreamMeta(nil, from, to, id)
		if err != nil {
			t.Fatal(err)
		}
		f, tt, got, err := ParseStreamMeta(b)
		if err != nil || f != from || tt != to || got != id {
			t.Fatalf("got %v %v %x %v", f, tt, got, err)
		}
		// A node daemon that knows only endpoint pairs refuses a resumable
		// stream rather than mistaking it for a plain one.
		if _, _, err := ParseEndpointPair(b); (err == nil) != id.IsZero() {
			t.Fatalf("ParseEndpointPair of %x: %v", id, err)
		}
	}
	b, _ := AppendEndpointPair(nil, from, to)
	if _, _, _, err := ParseStreamMeta(appendExt(b, ExtCritical|99, nil)); !errors.Is(err, ErrCritical) {
		t.Fatalf("unknown critical extension: %v", err)
	}
}

func TestPeerQueryReply(t *testing.T) {
	q := PeerQuery{Seen: netip.MustParseAddrPort("10.2.0.1:33000"), Local: netip.MustParseAddrPort("10.2.0.5:1024")}
	b := AppendPeerQuery(nil, &q)
	if got, err := ParsePeerQuery(b); err != nil || got != q {
		t.Fatalf("query: %+v %v", got, err)
	}
	if _, err := ParsePeerQuery(append(b, 0)); !errors.Is(err, ErrPayload) {
		t.Fatal("trailing byte accepted")
	}
	r := PeerReply{Found: true, SiteID: 1, Source: netip.MustParseAddrPort("10.1.0.7:40000")}
	b = AppendPeerReply(nil, &r)
	if got, err := ParsePeerReply(b); err != nil || got != r {
		t.Fatalf("reply: %+v %v", got, err)
	}
	neg := AppendPeerReply(nil, &PeerReply{})
	if got, err := ParsePeerReply(neg); err != nil || got.Found || got.Source.Port() != 0 {
		t.Fatalf("negative: %+v %v", got, err)
	}
	b[0] = 2
	if _, err := ParsePeerReply(b); !errors.Is(err, ErrPayload) {
		t.Fatal("found=2 accepted")
	}
}

func TestCodesWindow(t *testing.T) {
	var b [4]byte
	PutU32(b[:], uint32(CodeLinkLost))
	if c, err := DecodeCode(b[:]); err != nil || c != CodeLinkLost || c.String() != "link lost" {
		t.Fatalf("%v %v", c, err)
	}
	if _, err := DecodeCode(b[:3]); !errors.Is(err, ErrPayload) {
		t.Fatal("3-byte code accepted")
	}
	if _, err := DecodeWindow([]byte{0, 0, 0, 0}); !errors.Is(err, ErrPayload) {
		t.Fatal("zero window accepted")
	}
	if w, err := DecodeWindow([]byte{0, 1, 0, 0}); err != nil || w != 65536 {
		t.Fatalf("%d %v", w, err)
	}
	// CLAMP 0 is valid: it lifts the cap.
	if c, err := DecodeClamp([]byte{0, 0, 0, 0}); err != nil || c != 0 {
		t.Fatalf("%d %v", c, err)
	}
	if c, err := DecodeClamp([]byte{0, 8, 0, 0}); err != nil || c != 512<<10 {
		t.Fatalf("%d %v", c, err)
	}
	if _, err := DecodeClamp(b[:3]); !errors.Is(err, ErrPayload) {
		t.Fatal("3-byte clamp accepted")
	}
}

// oneByteReader returns at most one byte per Read, the worst case for
// the Reader's buffering.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func TestReaderFrames(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	var stream []byte
	type fr struct {
		h Header
		p []byte
	}
	var want []fr
	for i := range 300 {
		n := 1 + rnd.IntN(200)
		if i%10 == 0 {
			n = 1 + rnd.IntN(300<<10)
		}
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(rnd.Uint32())
		}
		h := Header{Type: TypeData, Stream: uint32(1 + i), Length: uint32(n)}
		want = append(want, fr{h, p})
		stream = AppendFrame(stream, TypeData, h.Stream, p)
		want = append(want, fr{Header{Type: TypeWindow, Stream: 5, Length: 4}, []byte{0, 0, 1, 0}})
		stream = AppendFrame(stream, TypeWindow, 5, []byte{0, 0, 1, 0})
	}
	for _, src := range []func() io.Reader{
		func() io.Reader { return bytes.NewReader(stream) },
		func() io.Reader { return oneByteReader{bytes.NewReader(stream)} },
	} {
		r := NewReader(src(), 4096)
		buf := make([]byte, MaxPayload)
		for i, w := range want {
			// Read DATA in two parts, as the relay does for a ring buffer.
			h, err := r.Next()
			if err != nil || h != w.h {
				t.Fatalf("frame %d: %+v %v", i, h, err)
			}
			half := int(h.Length) / 2
			n1, err := r.ReadPayload(buf[:half])
			if err != nil || n1 != half {
				t.Fatalf("frame %d part 1: %d %v", i, n1, err)
			}
			n2, err := r.ReadPayload(buf[half:])
			if err != nil || n1+n2 != len(w.p) || !bytes.Equal(buf[:len(w.p)], w.p) || r.Remaining() != 0 {
				t.Fatalf("frame %d part 2: %d %v", i, n2, err)
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("end: %v", err)
		}
	}
}

func TestReaderErrors(t *testing.T) {
	// Skipped payloads keep the stream in sync.
	s := AppendFrame(nil, TypeData, 1, []byte("hello world"))
	s = AppendFrame(s, TypePing, 0, []byte("12345678"))
	r := NewReader(bytes.NewReader(s), 16)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	h, p, err := r.ReadFrame(make([]byte, 8))
	if err != nil || h.Type != TypePing || string(p) != "12345678" {
		t.Fatalf("after skip: %+v %q %v", h, p, err)
	}
	// Too small a buffer for ReadFrame.
	r = NewReader(bytes.NewReader(s), 0)
	if _, _, err := r.ReadFrame(make([]byte, 4)); !errors.Is(err, ErrShort) {
		t.Fatalf("small buffer: %v", err)
	}
	if h, _, err := r.ReadFrame(make([]byte, 8)); err != nil || h.Type != TypePing {
		t.Fatalf("resync: %v", err)
	}
	// Truncation inside header and payload.
	for _, cut := range []int{5, Size + 3} {
		r = NewReader(bytes.NewReader(s[:cut]), 0)
		_, _, err := r.ReadFrame(make([]byte, 64))
		if err != io.ErrUnexpectedEOF {
			t.Errorf("cut %d: %v", cut, err)
		}
	}
	// Announced limit.
	r = NewReader(bytes.NewReader(s), 0)
	r.SetMaxPayload(4)
	if _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("limit: %v", err)
	}
	// A reader that makes no progress.
	r = NewReader(emptyReader{}, 0)
	if _, err := r.Next(); err != io.ErrNoProgress {
		t.Fatalf("no progress: %v", err)
	}
}

type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, nil }

func TestDecodeNoAlloc(t *testing.T) {
	b := enc(Header{Type: TypeData, Stream: 3, Length: 100})
	var h Header
	n := testing.AllocsPerRun(1000, func() {
		h, _ = Decode(b)
		h.Encode(b)
		PutU32(b[8:], 100)
	})
	if n != 0 {
		t.Fatalf("%v allocations per encode+decode", n)
	}
	// The Reader's steady state does not allocate either.
	var s []byte
	for range 100 {
		s = AppendFrame(s, TypeData, 1, make([]byte, 1000))
	}
	br := bytes.NewReader(s)
	r := NewReader(br, 0)
	buf := make([]byte, 1000)
	n = testing.AllocsPerRun(100, func() {
		if _, _, err := r.ReadFrame(buf); err == io.EOF {
			br.Reset(s)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per ReadFrame", n)
	}
}

func TestStrings(t *testing.T) {
	if TypeData.String() != "DATA" || TypeDataAt.String() != "DATA_AT" || Type(99).String() != "type(99)" || Code(42).String() != "code 42" {
		t.Fatal("names")
	}
	_ = reflect.TypeOf(Header{})
}

func BenchmarkEncode(b *testing.B) {
	buf := make([]byte, Size)
	h := Header{Type: TypeData, Stream: 7, Length: 128 << 10}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Stream = uint32(i)
		h.Encode(buf)
	}
}

func BenchmarkDecode(b *testing.B) {
	buf := enc(Header{Type: TypeData, Stream: 7, Length: 128 << 10})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReaderSmallFrames measures the frame reader on a stream of
// 64-byte DATA frames (the control/small-message path).
func BenchmarkReaderSmallFrames(b *testing.B) {
	var s []byte
	for range 1000 {
		s = AppendFrame(s, TypeData, 1, make([]byte, 64))
	}
	br := bytes.NewReader(s)
	r := NewReader(br, 0)
	buf := make([]byte, 64)
	b.ReportAllocs()
	b.SetBytes(64 + Size)
	for b.Loop() {
		if _, _, err := r.ReadFrame(buf); err == io.EOF {
			br.Reset(s)
			r.ReadFrame(buf)
		}
	}
}

func TestReadOne(t *testing.T) {
	body, err := AppendOpen(nil, &Open{Dst: netip.MustParseAddrPort("10.0.2.1:1024"), Src: netip.MustParseAddrPort("10.0.1.1:40000")})
	if err != nil {
		t.Fatal(err)
	}
	open := AppendFrame(nil, TypeOpen, 0, body)
	r := bytes.NewReader(append(append([]byte(nil), open...), "app bytes"...))
	h, p, err := ReadOne(r, MaxControl)
	if err != nil || h.Type != TypeOpen || !bytes.Equal(p, body) {
		t.Fatalf("ReadOne = %v %x %v", h, p, err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "app bytes" {
		t.Errorf("read ahead: left %q", rest)
	}
	if _, _, err := ReadOne(bytes.NewReader(open), 4); !errors.Is(err, ErrTooLarge) {
		t.Errorf("payload above max: %v", err)
	}
	if _, _, err := ReadOne(bytes.NewReader(open[:len(open)-2]), MaxControl); !errors.Is(err, io.ErrUnexpectedEOF) ||
		!strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated payload: %v", err)
	}
	if _, _, err := ReadOne(bytes.NewReader(nil), MaxControl); err != io.EOF {
		t.Errorf("empty: %v, want io.EOF", err)
	}
	bad := append([]byte(nil), open...)
	bad[0] ^= 0xff // version
	if _, _, err := ReadOne(bytes.NewReader(bad), MaxControl); err == nil {
		t.Error("undecodable header accepted")
	}
}

// TestReaderRelease: a Reader with nothing buffered gives its buffer up
// and takes one again for the next frame; with bytes buffered, or a
// payload still to be read, Release keeps them.
func TestReaderRelease(t *testing.T) {
	var in bytes.Buffer
	in.Write(AppendFrame(nil, TypeData, 1, []byte("first")))
	r := NewReader(&in, 0)
	if r.buf != nil {
		t.Fatal("a new Reader holds a buffer before any read")
	}
	h, p, err := r.ReadFrame(make([]byte, 16))
	if err != nil || h.Stream != 1 || string(p) != "first" {
		t.Fatalf("first frame: %v %q %v", h, p, err)
	}
	r.Release()
	if r.buf != nil {
		t.Fatal("Release kept the buffer of an empty Reader")
	}
	in.Write(AppendFrame(nil, TypeData, 2, []byte("second")))
	in.Write(AppendFrame(nil, TypeData, 3, []byte("third")))
	if h, err = r.Next(); err != nil || h.Stream != 2 {
		t.Fatalf("second header: %v %v", h, err)
	}
	r.Release() // the payload and the third frame are buffered
	if r.buf == nil {
		t.Fatal("Release dropped buffered bytes")
	}
	b := make([]byte, 6)
	if _, err := r.ReadPayload(b); err != nil || string(b) != "second" {
		t.Fatalf("second payload %q %v", b, err)
	}
	if h, p, err = r.ReadFrame(make([]byte, 16)); err != nil || h.Stream != 3 || string(p) != "third" {
		t.Fatalf("third frame: %v %q %v", h, p, err)
	}
}

func TestListenBody(t *testing.T) {
	b := AppendListen(nil, 40123)
	if p, err := ParseListen(b); err != nil || p != 40123 {
		t.Errorf("round trip: %d, %v", p, err)
	}
	for _, bad := range [][]byte{nil, {0, 0}, {1, 2, 3}} {
		if _, err := ParseListen(bad); !errors.Is(err, ErrPayload) {
			t.Errorf("ParseListen(% x): %v, want ErrPayload", bad, err)
		}
	}
}
