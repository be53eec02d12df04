package relay

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"golang.org/x/sys/unix"
)

// TestQuietLinks: idle links whose peers both have feature QUIET send no
// frame at all, plain or resuming, yet when the path between them dies
// the kernel's keepalive finds it within about DeadAfter: the plain link
// fails, the resuming one goes down to resume.
func TestQuietLinks(t *testing.T) {
	cfg := Config{PingInterval: 100 * time.Millisecond, DeadAfter: 1500 * time.Millisecond}
	t.Run("plain", func(t *testing.T) {
		ca, cb, ha, hb := handshaken(t, &cfg, 0, 1, header.FeatureQuiet)
		a := NewLink(ca, cfg, ha, true, HandlerFunc(dialHandler))
		b := NewLink(cb, cfg, hb, false, HandlerFunc(dialHandler))
		t.Cleanup(func() { a.Close(); b.Close() })
		quietThenDead(t, cfg, a, b, func(l *Link) bool {
			select {
			case <-l.Done():
				return true
			default:
				return false
			}
		})
	})
	t.Run("resuming", func(t *testing.T) {
		_, _, as, bs := resumingPairF(t, cfg, 1, header.FeatureQuiet)
		quietThenDead(t, cfg, as[0], bs[0], (*Link).Down)
	})
}

func quietThenDead(t *testing.T, cfg Config, a, b *Link, dead func(*Link) bool) {
	if !a.kernelWatch.Load() || !b.kernelWatch.Load() {
		t.Skip("the kernel refused the keepalive options: the links ping (covered by TestIdleKeepalive)")
	}
	time.Sleep(500 * time.Millisecond) // past the first ticks
	a0, b0 := a.Stats.FramesSent.Load(), b.Stats.FramesSent.Load()
	const span = 2 * time.Second // 20 ping periods, more than DeadAfter
	time.Sleep(span)
	if sa, sb := a.Stats.FramesSent.Load()-a0, b.Stats.FramesSent.Load()-b0; sa != 0 || sb != 0 {
		t.Errorf("idle quiet links sent frames in %v: dialer %d, acceptor %d; want none", span, sa, sb)
	}
	if a.Err() != nil || b.Err() != nil || a.Down() || b.Down() {
		t.Fatalf("idle quiet link ended: %v, %v", a.Err(), b.Err())
	}
	start := time.Now()
	blackHole(t, a)
	blackHole(t, b)
	// The kernel gives up DeadAfter after the last segment heard, at its
	// next probe (probes 1 s apart, the options' unit); the readers see it
	// at once, whatever the load on the machine.
	limit := cfg.DeadAfter + 3*time.Second
	for !dead(a) || !dead(b) {
		if time.Since(start) > limit {
			t.Fatalf("path dead for %v, links not taken for dead (dialer %v, acceptor %v)", limit, dead(a), dead(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("both ends found the dead path after %v", time.Since(start).Round(time.Millisecond))
	if err := a.Err(); err != nil && !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("dialer failed with %v, want the kernel's timeout", err)
	}
}

// TestQuietWakes: a stream opened on a quiet link wakes it: it pings
// again while the stream is open, even idle, and the silence of its quiet
// time, longer than DeadAfter, does not count against the peer.
func TestQuietWakes(t *testing.T) {
	cfg := Config{PingInterval: 100 * time.Millisecond, DeadAfter: 1500 * time.Millisecond}
	ca, cb, ha, hb := handshaken(t, &cfg, 0, 1, header.FeatureQuiet)
	a := NewLink(ca, cfg, ha, true, HandlerFunc(dialHandler))
	b := NewLink(cb, cfg, hb, false, HandlerFunc(dialHandler))
	t.Cleanup(func() { a.Close(); b.Close() })
	if !a.kernelWatch.Load() || !b.kernelWatch.Load() {
		t.Skip("the kernel refused the keepalive options")
	}
	time.Sleep(2 * cfg.DeadAfter) // quiet, silent for longer than DeadAfter
	app, _ := openVia(t, a, testnet.Echo(t, loopback))
	defer app.Close()
	echoRoundTrip(t, app)
	a0, b0 := a.Stats.FramesSent.Load(), b.Stats.FramesSent.Load()
	span := 2 * cfg.DeadAfter
	time.Sleep(span) // the stream stays open and idle
	// An idle link with a stream pings as before TestIdleKeepalive's: the
	// dialer about every 500 ms, the acceptor PONGs.
	if sa, sb := a.Stats.FramesSent.Load()-a0, b.Stats.FramesSent.Load()-b0; sa < 3 || sb < 3 {
		t.Errorf("frames sent in %v with a stream open: dialer %d, acceptor %d; want PINGs and their PONGs", span, sa, sb)
	}
	if a.Err() != nil || b.Err() != nil {
		t.Fatalf("a woken link ended: %v, %v", a.Err(), b.Err())
	}
	echoRoundTrip(t, app)
}

// blackHole drops every segment that reaches l's socket, as a dead path
// would: a socket filter runs before TCP sees a segment, so the kernel
// answers no keepalive probe either.
func blackHole(t *testing.T, l *Link) {
	t.Helper()
	rc, err := TCPOf(l.Conn()).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	prog := unix.SockFprog{Len: 1, Filter: &drop[0]}
	cerr := rc.Control(func(fd uintptr) {
		err = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog)
	})
	if err = errors.Join(cerr, err); err != nil {
		t.Fatal(err)
	}
}

// TestQuietOldPeer: a side whose peer lacks feature QUIET pings its idle
// link as before, whichever of the two dials, and the other side, which
// got the feature from it and is quiet, answers its PINGs.
func TestQuietOldPeer(t *testing.T) {
	cfg := Config{PingInterval: 100 * time.Millisecond, DeadAfter: 1500 * time.Millisecond}
	for _, oldDials := range []bool{false, true} {
		ca, cb, ha, hb := handshakenH(t, &cfg, func(h *header.Hello, dialer bool) {
			if dialer != oldDials {
				h.Features = header.FeatureQuiet
			}
		})
		a := NewLink(ca, cfg, ha, true, HandlerFunc(dialHandler))
		b := NewLink(cb, cfg, hb, false, HandlerFunc(dialHandler))
		t.Cleanup(func() { a.Close(); b.Close() })
		pinger, quiet := a, b // a's peer b is old: a pings
		if oldDials {
			pinger, quiet = b, a
		}
		time.Sleep(500 * time.Millisecond)
		p0, q0 := pinger.Stats.FramesSent.Load(), quiet.Stats.FramesSent.Load()
		const span = 3 * time.Second
		time.Sleep(span)
		sp, sq := pinger.Stats.FramesSent.Load()-p0, quiet.Stats.FramesSent.Load()-q0
		// Dialing, the pinger waits 400 ms of silence, accepting 700 ms:
		// about 6 or 4 PINGs in 3 s, each answered by a PONG.
		if sp < 2 || sq < 2 || sp > 12 || sq > sp+1 {
			t.Errorf("old peer dials %v: frames sent in %v by the side that pings %d, by the quiet side %d; want 2..12, and PONGs only from the quiet side",
				oldDials, span, sp, sq)
		}
		if pinger.kernelWatch.Load() || pinger.Err() != nil || quiet.Err() != nil {
			t.Errorf("old peer dials %v: the side that pings has its kernel watch on (%v), or a link ended: %v, %v",
				oldDials, pinger.kernelWatch.Load(), pinger.Err(), quiet.Err())
		}
		t.Logf("old peer dials %v: frames sent in %v: %d by the side that pings, %d by the quiet side", oldDials, span, sp, sq)
	}
}
