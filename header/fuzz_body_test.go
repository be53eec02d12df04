package header

import (
	"errors"
	"net/netip"
	"testing"
)

// bodySeeds are the endpoint encodings the body fuzzers start from: both
// families, the "none" endpoint, an IPv4-mapped IPv6 address as a peer
// could send it, and truncations.
func bodySeeds(f *testing.F) [][]byte {
	v4 := netip.MustParseAddrPort("10.0.0.1:40123")
	v6 := netip.MustParseAddrPort("[2001:db8::7]:5000")

	var seeds [][]byte
	for _, p := range [][2]netip.AddrPort{{v4, v6}, {v6, v4}, {v4, {}}, {{}, {}}, {v6, v6}} {
		b, err := AppendEndpointPair(nil, p[0], p[1])
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b, b[:len(b)-1], b[:1])
	}
	// Family 6 carrying a mapped address, which PutEndpoint never writes.
	m := []byte{6, 0, 80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2}

	seeds = append(seeds, append(append([]byte{}, m...), m...), []byte{5, 0, 0}, nil)
	return seeds
}

func sameEndpoint(a, b netip.AddrPort) bool {
	// A mapped address goes out unmapped: the two are one endpoint.
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

func payloadErr(t *testing.T, what string, b []byte, err error) {
	t.Helper()
	if !errors.Is(err, ErrPayload) && !errors.Is(err, ErrCritical) {
		t.Fatalf("%s(% x): %v is neither ErrPayload nor ErrCritical", what, b, err)
	}
}

// FuzzParseStreamMeta: the open metadata of a gateway's MX stream, as a
// node daemon reads it from the far site. Whatever parses re-encodes to
// metadata that parses to the same endpoints and resume id; every refusal
// is a payload error.
func FuzzParseStreamMeta(f *testing.F) {
	id := ResumeID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, s := range bodySeeds(f) {
		f.Add(s)
		if len(s) >= 14 {
			f.Add(appendExt(append([]byte{}, s...), ExtResume, id[:]))
		}
	}
	v4 := netip.MustParseAddrPort("10.0.0.1:40123")
	b, _ := AppendStreamMeta(nil, v4, v4, id)
	f.Add(b)
	f.Add(b[:len(b)-1])
	f.Add(appendExt(append([]byte{}, b...), ExtResume, id[:]))      // twice
	f.Add(appendExt(append([]byte{}, b...), ExtLabel, []byte("x"))) // skipped
	f.Add(appendExt(append([]byte{}, b...), ExtCritical|99, nil))   // refused
	f.Add(appendExt(b[:14], ExtResume, make([]byte, len(id))))      // zero id
	f.Add(appendExt(b[:14], ExtResume, id[:15]))                    // short id
	f.Add(append(b[:14], 0x80, 4, 0xff, 0xff))                      // overlong
	f.Fuzz(func(t *testing.T, b []byte) {
		from, to, id, err := ParseStreamMeta(b)
		if err != nil {
			payloadErr(t, "ParseStreamMeta", b, err)
			return
		}
		out, err := AppendStreamMeta(nil, from, to, id)
		if err != nil {
			t.Fatalf("%v %v %x does not re-encode: %v", from, to, id, err)
		}
		f2, t2, id2, err := ParseStreamMeta(out)
		if err != nil || !sameEndpoint(from, f2) || !sameEndpoint(to, t2) || id2 != id {
			t.Fatalf("% x: %v %v %x re-parses as %v %v %x (%v)", b, from, to, id, f2, t2, id2, err)
		}
		if len(out) > len(b) {
			t.Fatalf("% x re-encodes longer: % x", b, out)
		}
	})
}

// FuzzParseEndpointPair: the open metadata a node daemon sends its
// gateway. Exactly two endpoints parse; they re-encode to metadata that
// parses to the same two.
func FuzzParseEndpointPair(f *testing.F) {
	for _, s := range bodySeeds(f) {
		f.Add(s)
		f.Add(append(append([]byte{}, s...), 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		from, to, err := ParseEndpointPair(b)
		if err != nil {
			payloadErr(t, "ParseEndpointPair", b, err)
			return
		}
		out, err := AppendEndpointPair(nil, from, to)
		if err != nil {
			t.Fatalf("%v %v does not re-encode: %v", from, to, err)
		}
		f2, t2, err := ParseEndpointPair(out)
		if err != nil || !sameEndpoint(from, f2) || !sameEndpoint(to, t2) {
			t.Fatalf("% x: %v %v re-parses as %v %v (%v)", b, from, to, f2, t2, err)
		}
		if len(out) > len(b) {
			t.Fatalf("% x re-encodes longer: % x", b, out)
		}
	})
}

// FuzzParseListen: a LISTEN body from a rank. Only two bytes naming a
// port other than 0 parse, and they re-encode to themselves.
func FuzzParseListen(f *testing.F) {
	f.Add(AppendListen(nil, 40123))
	f.Add(AppendListen(nil, 1))
	f.Add(AppendListen(nil, 65535))
	f.Add([]byte{0, 0})
	f.Add([]byte{1})
	f.Add([]byte{1, 2, 3})
	f.Add([]byte(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		port, err := ParseListen(b)
		if err != nil {
			payloadErr(t, "ParseListen", b, err)
			return
		}
		if port == 0 || string(AppendListen(nil, port)) != string(b) {
			t.Fatalf("% x parses as port %d", b, port)
		}
	})
}
