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
		{[]string{"--lan-transport", "mx", "--lan-if", "eth9", "--lan-forward", "pipelined"}, ""},
		{[]string{"--lan-transport", "mx", "--lan-if", "eth9", "--lan-forward", "chunked"}, ""},
		{[]string{"--lan-forward", "pipelined"}, "applies to --lan-transport mx only"},
		{[]string{"--lan-transport", "mx", "--lan-if", "eth9", "--lan-forward", "both"}, "want chunked, pipelined"},
	} {
		cfg, err := testConfig(m, "a", c.args...)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%v: %v, want %q", c.args, err, c.err)
		}
		if err == nil && len(c.args) > 0 && cfg.LANTransport != c.args[1] {
			t.Errorf("%v: transport %q", c.args, cfg.LANTransport)
		}
		if err == nil && len(c.args) > 5 && cfg.LANForward != c.args[5] {
			t.Errorf("%v: forwarding %q", c.args, cfg.LANForward)
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
