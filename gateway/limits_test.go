package gateway

import "testing"

// TestLimitsFollowTheLAN: with kernel TCP on the LAN the stream limits
// follow the open-file limit (at most 64 Ki); MX streams hold no
// descriptor, and their bound is maxMXStreams whatever the limit (a
// quarter of it per peer site here, with 4 of them, and per source host).
func TestLimitsFollowTheLAN(t *testing.T) {
	var tcp, mx, mxT Config
	mx.LANTransport = "mx"
	mxT.Transport = &MXTransport{}
	for _, c := range []*Config{&tcp, &mx, &mxT} {
		c.fillLimits(4)
	}
	if tcp.MaxLANConns > 1<<16 || tcp.MaxPeerStreams > 1<<16 {
		t.Errorf("kernel TCP LAN: MaxLANConns %d, MaxPeerStreams %d: want at most 65536", tcp.MaxLANConns, tcp.MaxPeerStreams)
	}
	for name, c := range map[string]*Config{"--lan-transport mx": &mx, "MXTransport": &mxT} {
		if c.MaxLANConns != maxMXStreams || c.MaxPeerStreams != maxMXStreams/4 || c.MaxSourceStreams != maxMXStreams/4 {
			t.Errorf("%s: MaxLANConns %d, MaxPeerStreams %d, MaxSourceStreams %d: want %d, %d, %d",
				name, c.MaxLANConns, c.MaxPeerStreams, c.MaxSourceStreams, maxMXStreams, maxMXStreams/4, maxMXStreams/4)
		}
	}
}

// TestSourceLimitsDefaults: one host's streams and control connections
// together stay below half of MaxLANConns, whatever the descriptor
// budget, so another host always finds room; MaxSourcePending has no cap
// of its own (admit makes room instead).
func TestSourceLimitsDefaults(t *testing.T) {
	for _, conns := range []int{64, 2048, 10000, 1 << 16, maxMXStreams} {
		c := Config{LimitsConfig: LimitsConfig{MaxLANConns: conns}}
		c.fillLimits(1)
		if held := c.MaxSourceStreams + c.MaxSourceControl; held > conns/2 {
			t.Errorf("MaxLANConns %d: one host may hold %d streams and %d control connections, above half", conns, c.MaxSourceStreams, c.MaxSourceControl)
		}
		if c.MaxSourceControl < 16 || c.MaxSourceControl > maxSourceControl || c.MaxSourcePending != c.MaxPendingLAN || c.ControlIdle <= 0 {
			t.Errorf("MaxLANConns %d: MaxSourceControl %d, MaxSourcePending %d (MaxPendingLAN %d), ControlIdle %v",
				conns, c.MaxSourceControl, c.MaxSourcePending, c.MaxPendingLAN, c.ControlIdle)
		}
		if err := c.checkLimits(); err != nil {
			t.Error(err)
		}
	}
	bad := Config{LimitsConfig: LimitsConfig{MaxSourceControl: -1}}
	if err := bad.checkLimits(); err == nil {
		t.Error("a negative MaxSourceControl passed")
	}
}
