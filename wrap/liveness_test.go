package wrap

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLiveness: a gateway failure ends the job only when its site has no
// gateway left; a gateway reported twice counts once; the summary line
// names every dead gateway with its host and site.
func TestLiveness(t *testing.T) {
	a, b := &Site{Name: "a", Gateway: SiteHost{Host: Host{Name: "gw.a"}}}, &Site{Name: "b", Gateway: SiteHost{Host: Host{Name: "gw.b"}}}
	a1 := &gateway{site: a}
	a2 := &gateway{site: a, host: SiteHost{Host: Host{Name: "gw2.a"}}}
	a3 := &gateway{site: a, host: SiteHost{Host: Host{Name: "gw3.a"}}}
	b1 := &gateway{site: b}
	live := newLiveness([]*gateway{a1, a2, a3, b1})
	if d := live.died(); d != "" {
		t.Errorf("died() before any failure: %q", d)
	}
	steps := []struct {
		g        *gateway
		siteDown bool
		left     int
	}{
		{a2, false, 2},
		{a2, false, 2}, // the same gateway again: no change
		{a3, false, 1},
		{a1, true, 0},
	}
	for i, st := range steps {
		f := &gatewayFailure{g: st.g, why: "exited during the job (signal: killed)"}
		if got := live.failed(f); got != st.siteDown {
			t.Errorf("step %d (%s): site down %v, want %v", i, st.g.hostName(), got, st.siteDown)
		}
		if n := live.left[a]; n != st.left {
			t.Errorf("step %d: site a has %d gateways left, want %d", i, n, st.left)
		}
		if !st.siteDown && i != 1 {
			line := live.survived(f)
			for _, want := range []string{"site a: the gateway on " + st.g.hostName() + " exited during the job (signal: killed)",
				"the ranks' connections through it are reset", "the job goes on"} {
				if !strings.Contains(line, want) {
					t.Errorf("step %d: line lacks %q: %s", i, want, line)
				}
			}
		}
	}
	if len(live.dead) != 3 {
		t.Errorf("%d dead gateways recorded, want 3", len(live.dead))
	}
	// With MX LANs the connections move instead.
	live.resumable = true
	if line := live.survived(live.dead[0]); !strings.Contains(line, "the ranks' connections through it move, with new ones, to the site's") {
		t.Errorf("MX LANs: %s", line)
	}
	if live.dead[2].of != 3 || !strings.Contains(live.dead[2].Error(), "the last of its 3 gateways; the job was ended") {
		t.Errorf("the site's last gateway: %v", live.dead[2])
	}
	want := "  died during the job: a@gw2.a (host gw2.a, site a) exited during the job (signal: killed); " +
		"a@gw3.a (host gw3.a, site a) exited during the job (signal: killed); a (host gw.a, site a) exited during the job (signal: killed)"
	if d := live.died(); d != want {
		t.Errorf("died():\n%q\nwant\n%q", d, want)
	}
	// A site with one gateway goes down with it.
	if !live.failed(&gatewayFailure{g: b1, why: "x"}) {
		t.Error("site b's only gateway failed: want the site down")
	}
	// No liveness (no gateways watched): every failure ends the job.
	var none *liveness
	if !none.failed(&gatewayFailure{g: b1}) || none.died() != "" {
		t.Error("nil liveness")
	}
}

// lockedWriter is a bytes.Buffer safe for the wrapper's lines and the
// launcher's output copied at the same time.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// twoGatewayConfig is failfastConfig with site1's gateways on gw.site1 and
// node-2.site1 (fake gateways on both addresses), site2's on gw.site2;
// each launcher runs script with $1 its host.
func twoGatewayConfig(t *testing.T, script, mpirun string) (Config, *lockedWriter) {
	t.Helper()
	f := newFakeGatewaysAt(t, "127.0.1.2", "127.0.1.12", "127.0.2.2")
	c := failfastConfig(t, f, script, mpirun)
	c.Gateways = map[string]string{"site1": "gw.site1,node-2.site1", "site2": "gw.site2"}
	errw := &lockedWriter{}
	c.Stderr = errw
	return c, errw
}

// A gateway that dies while its site keeps another does not end the job:
// one line names it (host, site) and says its connections are reset, the
// job's status is kept, and the summary names the dead gateway.
func TestRunGatewayDiesSiteKeepsOne(t *testing.T) {
	c, errw := twoGatewayConfig(t, "if [ \"$1\" = node-2.site1 ]; then sleep 1; exit 137; fi\nexec sleep 300", "sleep 3; exit 0")
	code, err, took := runBounded(t, c, 30*time.Second)
	out := errw.String()
	if code != 0 || err != nil {
		t.Fatalf("code %d err %v, want the job's 0:\n%s", code, err, out)
	}
	if took < 3*time.Second {
		t.Errorf("Run took %v: the job was cut short", took)
	}
	for _, want := range []string{
		"mpi5k: site site1: the gateway on node-2.site1 exited during the job (exit status 137); the ranks' connections through it are reset, new ones go to the site's 1 other gateway; the job goes on\n",
		"mpi5k: gateway summary\n",
		"  died during the job: site1@node-2.site1 (host node-2.site1, site site1) exited during the job (exit status 137)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "the gateway on node-2.site1 exited"); n != 1 {
		t.Errorf("the death is told %d times, want once:\n%s", n, out)
	}
}

// When the last gateway of a site dies the job is ended with
// ExitGatewayFailed, after the earlier death was told and survived.
func TestRunGatewayDiesSiteKeepsNone(t *testing.T) {
	rank := sleepMarker(60)
	c, errw := twoGatewayConfig(t, "case \"$1\" in node-2.site1) sleep 1; exit 137;; gw.site1) sleep 2; exit 1;; esac\nexec sleep 300", "sleep "+rank)
	code, err, took := runBounded(t, c, 30*time.Second)
	out := errw.String()
	if code != ExitGatewayFailed || err == nil {
		t.Fatalf("code %d err %v, want %d and an error:\n%s", code, err, ExitGatewayFailed, out)
	}
	if want := "site site1: the gateway on gw.site1 exited during the job (exit status 1), the last of its 2 gateways; the job was ended"; !strings.Contains(err.Error(), want) {
		t.Errorf("error lacks %q:\n%v", want, err)
	}
	if !strings.Contains(out, "the gateway on node-2.site1 exited during the job (exit status 137); the ranks' connections through it are reset") {
		t.Errorf("the first death is not told:\n%s", out)
	}
	if !strings.Contains(out, "died during the job: site1@node-2.site1 (host node-2.site1, site site1) exited during the job (exit status 137); site1 (host gw.site1, site site1)") {
		t.Errorf("summary does not name both dead gateways:\n%s", out)
	}
	// Generous: the point is that the job is ended, not waited for (its
	// rank sleeps 60 s); -race on a loaded machine is slow.
	if took > 2*time.Second+mpiTERM+stopEOF+stopTERM+10*time.Second {
		t.Errorf("Run took %v after the site's last gateway died at 2 s", took)
	}
	noneLeft(t, rank)
}

// A job that fails after a gateway died (its connections were reset) exits
// ExitGatewayFailed with an error naming the gateway.
func TestRunJobFailsAfterGatewayDied(t *testing.T) {
	c, errw := twoGatewayConfig(t, "if [ \"$1\" = node-2.site1 ]; then sleep 1; exit 137; fi\nexec sleep 300", "sleep 2; exit 3")
	code, err, _ := runBounded(t, c, 30*time.Second)
	if code != ExitGatewayFailed || err == nil {
		t.Fatalf("code %d err %v, want %d and an error:\n%s", code, err, ExitGatewayFailed, errw.String())
	}
	want := "the job failed (status 3) after the gateway on node-2.site1 (site site1) exited during the job (exit status 137): the ranks' connections through it were reset"
	if err.Error() != want {
		t.Errorf("error:\n%v\nwant\n%s", err, want)
	}
}
