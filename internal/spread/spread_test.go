package spread

import (
	"slices"
	"testing"
)

// TestOrder: every order holds each gateway once; consecutive orders start
// at consecutive gateways; a failed gateway goes last until it succeeds.
func TestOrder(t *testing.T) {
	var o Order
	first := o.Next(3)
	for k := range 5 {
		got := o.Next(3)
		s := slices.Clone(got)
		slices.Sort(s)
		if !slices.Equal(s, []int{0, 1, 2}) {
			t.Fatalf("order %v: want each of 3 gateways once", got)
		}
		if want := (first[0] + k + 1) % 3; got[0] != want {
			t.Fatalf("order %d starts at %d, want %d (round robin)", k+1, got[0], want)
		}
	}
	o.Failed(1)
	for range 3 {
		if got := o.Next(3); got[2] != 1 {
			t.Fatalf("after gateway 1 failed: order %v, want it last", got)
		}
	}
	o.Succeeded(1)
	seen := false
	for range 3 {
		seen = seen || o.Next(3)[0] == 1
	}
	if !seen {
		t.Fatal("gateway 1 never first again after it succeeded")
	}
}
