package relay

import (
	"testing"
	"time"
)

// TestIdleKeepalive: on an idle link only the dialer pings, about every
// third of DeadAfter, and neither side takes the link for dead; on a link
// that resumes, the ACKs of the keepalives do not make it busy.
func TestIdleKeepalive(t *testing.T) {
	cfg := Config{PingInterval: 100 * time.Millisecond, DeadAfter: 1500 * time.Millisecond}
	t.Run("plain", func(t *testing.T) {
		a, b := pair(t, cfg)
		idleKeepalive(t, a, b)
	})
	t.Run("resuming", func(t *testing.T) {
		_, _, as, bs := resumingPair(t, cfg, 1)
		idleKeepalive(t, as[0], bs[0])
	})
}

func idleKeepalive(t *testing.T, a, b *Link) {
	time.Sleep(500 * time.Millisecond) // past the first ticks
	a0, b0 := a.Stats.FramesSent.Load(), b.Stats.FramesSent.Load()
	const span = 3 * time.Second
	time.Sleep(span)
	sa, sb := a.Stats.FramesSent.Load()-a0, b.Stats.FramesSent.Load()-b0
	// The dialer pings when silent for idlePing - PingInterval (400 ms),
	// so on 100 ms ticks every 500 ms: about 6 PINGs, 6 PONGs back; the
	// acceptor (700 ms) does not ping: far from the 60 each that a PING
	// each way every tick, with its PONG, would send.
	if sa < 3 || sa > 12 || sb < 3 || sb > 12 {
		t.Errorf("frames sent in %v: dialer %d, acceptor %d; want about 6 each (PINGs one way, PONGs back), at most 12", span, sa, sb)
	}
	t.Logf("frames sent in %v: dialer %d, acceptor %d", span, sa, sb)
	if b.Stats.FramesRecv.Load() == 0 || a.Err() != nil || b.Err() != nil {
		t.Fatalf("link ended: %v, %v", a.Err(), b.Err())
	}
}

// TestSilentPeerDead: a peer that sends nothing is taken for dead after
// DeadAfter, whether this side dials (and pings first) or accepts (and
// pings only after a longer silence).
func TestSilentPeerDead(t *testing.T) {
	for _, dialer := range []bool{true, false} {
		cfg := Config{PingInterval: 100 * time.Millisecond, DeadAfter: time.Second}
		ca, cb, ha, _ := handshaken(t, &cfg, 0, 1, 0)
		defer cb.Close() // open, never read or written: a silent peer
		start := time.Now()
		a := NewLink(ca, cfg, ha, dialer, HandlerFunc(dialHandler))
		select {
		case <-a.Done():
			if d := time.Since(start); d < cfg.DeadAfter {
				t.Errorf("dialer %v: dead after %v, before DeadAfter %v", dialer, d, cfg.DeadAfter)
			}
		// A late keeper counts silence from its return (keep.go), so a
		// loaded machine (-race beside other tests) can delay the verdict:
		// the bound is generous; a peer never taken for dead still fails.
		case <-time.After(cfg.DeadAfter + 8*time.Second):
			t.Errorf("dialer %v: a silent peer not taken for dead %v after DeadAfter", dialer, 8*time.Second)
			a.Close()
		}
	}
}
