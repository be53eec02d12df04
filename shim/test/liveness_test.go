package shimtest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The shim's liveness options (shim/relay.go): keepalive after 5 s idle,
// every 1 s, 5 probes, and a 10 s user timeout.
const wantLiveness = "keepalive=1 idle=5 intvl=1 cnt=5 user_timeout=10000"

// TestLivenessConnect: a relayed connect() gets keepalive and a user
// timeout, so a rank never waits forever on a gateway host that died; an
// application's own keepalive settings are left as they are.
func TestLivenessConnect(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	out := run(t, l.env("a"), 20*time.Second, "liveness", srcA, "127.0.2.1", fmt.Sprint(port))
	if !strings.Contains(out, "connect "+wantLiveness) {
		t.Errorf("relayed socket: %q, want %q", strings.TrimSpace(out), wantLiveness)
	}
	out = run(t, l.env("a"), 20*time.Second, "liveness", srcA, "127.0.2.1", fmt.Sprint(port), "own")
	if !strings.Contains(out, "connect keepalive=1 idle=77 ") || !strings.Contains(out, "user_timeout=0") {
		t.Errorf("socket with the application's own keepalive: %q, want idle=77 and no user timeout", strings.TrimSpace(out))
	}
	// Passed through (same site): untouched.
	port2, _ := echoServer(t, "127.0.1.2:0")
	out = run(t, l.env("a"), 20*time.Second, "liveness", srcA, "127.0.1.2", fmt.Sprint(port2))
	if !strings.Contains(out, "connect keepalive=0 ") {
		t.Errorf("same-site socket: %q, want no keepalive", strings.TrimSpace(out))
	}
}

// TestLivenessAccept: a connection accepted from a gateway gets the same
// options.
func TestLivenessAccept(t *testing.T) {
	l := newLab(t)
	port := freePort(t, "127.0.2.1")
	sout, wait := startServer(t, l, "liveness-accept", "127.0.2.1", fmt.Sprint(port))
	run(t, l.env("a"), 20*time.Second, "liveness", srcA, "127.0.2.1", fmt.Sprint(port))
	wait()
	if !strings.Contains(sout.String(), "accept "+wantLiveness) {
		t.Errorf("accepted socket: %q, want %q", strings.TrimSpace(sout.String()), wantLiveness)
	}
}
