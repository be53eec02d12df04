package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// TestDoctorLab runs `mpi5k doctor` on the lab's hosts as a user would
// on a grid: from one node, over ssh, on a node and both gateway hosts.
// Every host reports each check; the node host, whose
// tcp_slow_start_after_idle is the kernel's 1, gets the keep-warm warning
// and the gateway hosts (0, as the service unit sets it) do not; an
// unreachable peer gateway (the WAN dropped) fails the run with the host, the address and
// a fix.
func TestDoctorLab(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Nodes: 1})
	mpi5k, _ := filepath.Abs("../bin/mpi5k")
	shim, _ := filepath.Abs("../bin/libmpi5k.so")
	node, gw1, gw2 := l.Hosts("site1", false)[0], l.Gateway("site1"), l.Gateway("site2")
	doctor := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		argv := append([]string{"doctor", "--mpi5k", mpi5k, "--preload", shim}, args...)
		out, err := l.CommandContext(ctx, node, mpi5k, argv...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("mpi5k doctor: %v: %s", err, out)
		}
		return string(out), code
	}

	out, code := doctor("--reach-wan=false", node, gw1, gw2)
	t.Logf("%s", out)
	if code != 0 {
		t.Fatalf("doctor exited %d on a lab whose hosts have everything", code)
	}
	for _, h := range []string{node, gw1, gw2} {
		for _, check := range []string{"OK   kernel", "OK   cc bbr", "OK   LAN port", "OK   WAN port", "OK   shim"} {
			if !strings.Contains(out, h+": "+check) {
				t.Errorf("%s: no %q line", h, check)
			}
		}
	}
	if !strings.Contains(out, node+": WARN keep warm") {
		t.Errorf("%s (tcp_slow_start_after_idle 1): no keep-warm warning", node)
	}
	for _, h := range []string{gw1, gw2} {
		if !strings.Contains(out, h+": OK   keep warm") {
			t.Errorf("%s (tcp_slow_start_after_idle 0): keep warm not OK", h)
		}
	}

	// With the WAN dropped, gw.site2's WAN port cannot be reached: the
	// reach check of gw.site1 must fail, naming the address, and so must
	// the run. (Refused would pass: the host answers, no gateway runs yet.)
	blackhole(t, l)
	out, code = doctor("--wan-port", "5001", "--timeout", "1s", gw1, gw2)
	t.Logf("%s", out)
	if code != 1 {
		t.Fatalf("doctor exited %d with an unreachable peer gateway, want 1", code)
	}
	if !strings.Contains(out, gw1+": FAIL") || !strings.Contains(out, gw2+":5001") {
		t.Errorf("no failed reach check of %s naming %s:5001", gw1, gw2)
	}
}
