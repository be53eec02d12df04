package trace

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Wall: 1_700_000_000_123_456_789, Mono: 987654321, PID: 4242, SiteID: 7, Host: "node-1.site1", Site: "lyon"}
	b := h.Encode(nil)
	if len(b) != HeaderSize {
		t.Fatalf("header is %d bytes, want %d", len(b), HeaderSize)
	}
	got, err := DecodeHeader(b)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v; want %+v", got, err, h)
	}
	if w := got.WallTime(h.Mono + 1000); w.UnixNano() != h.Wall+1000 {
		t.Errorf("WallTime = %v", w)
	}
	// long names are truncated, never overflow into the next field
	long := Header{Host: strings.Repeat("h", 100), Site: strings.Repeat("s", 100)}
	got, _ = DecodeHeader(long.Encode(nil))
	if len(got.Host) != maxHost || len(got.Site) != maxSite {
		t.Errorf("truncation: host %d site %d bytes", len(got.Host), len(got.Site))
	}
}

func TestHeaderErrors(t *testing.T) {
	good := (&Header{PID: 1}).Encode(nil)
	for name, c := range map[string]struct {
		mutate func([]byte) []byte
		want   error
	}{
		"short":       {func(b []byte) []byte { return b[:100] }, ErrFormat},
		"magic":       {func(b []byte) []byte { b[0] = 'X'; return b }, ErrMagic},
		"version":     {func(b []byte) []byte { b[8] = 2; return b }, ErrVersion},
		"record size": {func(b []byte) []byte { b[12] = 32; return b }, ErrFormat},
	} {
		b := c.mutate(append([]byte(nil), good...))
		if _, err := DecodeHeader(b); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	recs := []Record{
		{Mono: 1, Dur: 250 * time.Nanosecond, TID: 9, FD: 12, Kind: KindCall, Fn: FnWritev, Flags: FlagRelayed, Ret: 4096, Req: 8192},
		{Mono: 2, TID: 9, FD: 12, Kind: KindCall, Fn: FnRecv, Ret: -1, Req: 10, Errno: 11},
		{Mono: 3, TID: 9, FD: 13, Kind: KindConn, Fn: FnAccept, Flags: FlagTruePeer,
			Local: netip.MustParseAddrPort("10.77.2.11:1024"), Peer: netip.MustParseAddrPort("10.77.1.11:40000"), Site: 1},
		{Mono: 4, FD: 14, Kind: KindConn, Fn: FnConnect,
			Local: netip.MustParseAddrPort("[2001:db8::1]:5"), Peer: netip.MustParseAddrPort("[2001:db8::2]:6")},
		{Mono: 5, FD: -1, Kind: KindLost, Ret: 77},
	}
	var file bytes.Buffer
	file.Write((&Header{PID: 1}).Encode(nil))
	for i := range recs {
		b := recs[i].Encode(nil)
		if len(b) != RecordSize {
			t.Fatalf("record is %d bytes", len(b))
		}
		file.Write(b)
	}
	r, err := NewReader(&file)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range recs {
		got, err := r.Next()
		if err != nil || got != want {
			t.Fatalf("record %d: got %+v, %v; want %+v", i, got, err, want)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("end: %v, want EOF", err)
	}
}

func TestRecordErrors(t *testing.T) {
	good := (&Record{Kind: KindCall, Fn: FnRead}).Encode(nil)
	for name, c := range map[string]func([]byte) []byte{
		"short":    func(b []byte) []byte { return b[:63] },
		"kind":     func(b []byte) []byte { b[20] = 9; return b },
		"function": func(b []byte) []byte { b[21] = 200; return b },
		"family":   func(b []byte) []byte { b[20] = byte(KindConn); b[24] = 5; return b },
	} {
		if _, err := DecodeRecord(c(append([]byte(nil), good...))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err %v, want ErrFormat", name, err)
		}
	}
	// a truncated last record is reported, not silently dropped
	var file bytes.Buffer
	file.Write((&Header{}).Encode(nil))
	file.Write(good[:30])
	r, _ := NewReader(&file)
	if _, err := r.Next(); err != io.ErrUnexpectedEOF {
		t.Errorf("truncated record: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add((&Record{Kind: KindCall, Fn: FnRead}).Encode((&Header{}).Encode(nil)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		for {
			rec, err := r.Next()
			if err != nil {
				return
			}
			// whatever decodes must encode back to the same bytes' meaning
			again, err := DecodeRecord(rec.Encode(nil))
			if err != nil || again != rec {
				t.Fatalf("re-encode: %+v -> %+v, %v", rec, again, err)
			}
		}
	})
}

// The rank survives a round trip; a header written without one (the three
// bytes zero, as in files from before ranks were recorded) reads as -1.
func TestHeaderRank(t *testing.T) {
	for _, r := range []int32{0, 1, 255, 256, 70000, MaxRank - 1, -1} {
		h, err := DecodeHeader((&Header{Rank: r}).Encode(nil))
		if err != nil || h.Rank != r {
			t.Errorf("rank %d: got %d, %v", r, h.Rank, err)
		}
	}
	b := (&Header{Rank: 5}).Encode(nil)
	b[37], b[38], b[39] = 0, 0, 0
	if h, _ := DecodeHeader(b); h.Rank != -1 {
		t.Errorf("old header: rank %d, want -1", h.Rank)
	}
}
