package testbed

import (
	"strings"
	"testing"
)

// TestTxBytes: the transmitted bytes of every interface but lo are summed;
// a short line is an error naming the interface.
func TestTxBytes(t *testing.T) {
	dev := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 900 9 0 0 0 0 0 0 900 9 0 0 0 0 0 0
  eth0: 1000 10 0 0 0 0 0 0 4000 40 0 0 0 0 0 0
x-1.site1-0: 5 1 0 0 0 0 0 0 250 3 0 0 0 0 0 0
`
	n, err := txBytes([]byte(dev))
	if err != nil || n != 4250 {
		t.Fatalf("txBytes: %d, %v; want 4250", n, err)
	}
	if _, err := txBytes([]byte("  eth1: 1 2 3\n")); err == nil || !strings.Contains(err.Error(), "eth1") {
		t.Fatalf("a short line: %v, want an error naming eth1", err)
	}
}
