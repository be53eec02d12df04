package degraded

import "testing"

func TestText(t *testing.T) {
	for _, r := range []string{RTOFloor, NoBBR, NoCubic, NotWarm, WarmUnknown} {
		if Text(r) == r {
			t.Errorf("reason %s has no sentence", r)
		}
	}
	if got := Text("from_a_newer_gateway"); got != "from_a_newer_gateway" {
		t.Errorf("an unknown reason reads %q, want itself", got)
	}
}
