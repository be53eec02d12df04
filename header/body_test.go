package header

import (
	"net/netip"
	"strings"
	"testing"
)

// TestEndpointPair: what a node daemon writes, its gateway reads back, v4
// and v6; a truncated pair and trailing bytes are refused.
func TestEndpointPair(t *testing.T) {
	from := netip.MustParseAddrPort("10.1.0.3:40000")
	to := netip.MustParseAddrPort("[fd00::7]:5001")
	b, err := AppendEndpointPair([]byte{9}, from, to)
	if err != nil || b[0] != 9 {
		t.Fatalf("append: %v %v", b, err)
	}
	f, g, err := ParseEndpointPair(b[1:])
	if err != nil || f != from || g != to {
		t.Fatalf("parse: %v %v %v", f, g, err)
	}
	if _, _, err := ParseEndpointPair(b[1 : len(b)-1]); err == nil {
		t.Error("a truncated pair parsed")
	}
	if _, _, err := ParseEndpointPair(append(b[1:], 0)); err == nil || !strings.Contains(err.Error(), "1 bytes after") {
		t.Errorf("trailing byte: %v", err)
	}
}
