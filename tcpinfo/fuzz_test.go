package tcpinfo

import (
	"reflect"
	"testing"
)

// FuzzDecode: Decode of any bytes never panics, refuses fewer than the
// original struct's, and reports the length it was given. A shorter
// struct (an older kernel's) decodes every field it reports to the same
// value as the struct with more bytes after it: a field that does not
// fit whole is zero, never read from a part of its bytes.
func FuzzDecode(f *testing.F) {
	// The kernel's own encoding of a live loopback connection, then the
	// struct's historical lengths.
	if c := tcpPair(f, ""); c != nil {
		var r Raw
		if rc, err := c.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { ReadRaw(int(fd), &r) })
			f.Add(append([]byte(nil), r.Bytes()...))
		}
	}
	full := make([]byte, endKnown+16)
	for i := range full {
		full[i] = byte(i*7 + 1)
	}
	for _, n := range []int{0, 1, offPacingRate - 1, offPacingRate, offBytesAcked, offSegsOut, offMinRTT + 4, offDeliveryRate,
		offBusyTime, offDelivered, offBytesSent, offDSACKDups, offSndWnd, offRehash, offTotalRTO + 1, offTotalRTORecoveries + 1,
		offTotalRTOTime + 3, endKnown, endKnown + 16} {
		f.Add(full[:n])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in Info
		err := Decode(b, &in)
		if (err != nil) != (len(b) < offPacingRate) {
			t.Fatalf("Decode of %d bytes: %v", len(b), err)
		}
		if err != nil {
			return
		}
		if in.Len != len(b) {
			t.Fatalf("Len %d for %d bytes", in.Len, len(b))
		}
		// Against the same bytes with more after them.
		var long Info
		more := make([]byte, 64)
		for i := range more {
			more[i] = 0xa5
		}
		if err := Decode(append(append([]byte(nil), b...), more...), &long); err != nil {
			t.Fatal(err)
		}
		vs, vl := reflect.ValueOf(in), reflect.ValueOf(long)
		for i := range vs.NumField() {
			name := vs.Type().Field(i).Name
			if name == "Len" {
				continue
			}
			if s := vs.Field(i); !s.IsZero() && !s.Equal(vl.Field(i)) {
				t.Fatalf("%d bytes: %s is %v, %v with more bytes after", len(b), name, s, vl.Field(i))
			}
		}
		var bb BBR
		if DecodeBBR(b, &bb) == nil && len(b) != bbrInfoSize {
			t.Fatalf("DecodeBBR took %d bytes", len(b))
		}
	})
}
