package gateway

import (
	"strings"
	"testing"
)

func TestLANTransportFlag(t *testing.T) {
	m := testMap(t)
	for _, c := range []struct {
		args []string
		err  string
	}{
		{nil, ""},
		{[]string{"--lan-transport", "tcp"}, ""},
		{[]string{"--lan-transport", "mx", "--lan-if", "eth9"}, ""},
		{[]string{"--lan-transport", "mx"}, "needs --lan-if"},
		{[]string{"--lan-transport", "udp"}, "want tcp, mx"},
	} {
		cfg, err := testConfig(m, "a", c.args...)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%v: %v, want %q", c.args, err, c.err)
		}
		if err == nil && len(c.args) > 0 && cfg.LANTransport != c.args[1] {
			t.Errorf("%v: transport %q", c.args, cfg.LANTransport)
		}
	}
	// A missing interface is named with the fix, before anything starts.
	cfg, err := testConfig(m, "a", "--lan-transport", "mx", "--lan-if", "mxt-none0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), `--lan-if "mxt-none0"`) {
		t.Fatalf("mx on a missing interface: %v", err)
	}
}
