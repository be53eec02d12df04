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
