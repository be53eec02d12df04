package wrap

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeGateways serves /ready and /metrics for the two test sites on
// gw.site1's and gw.site2's loopback addresses (labAddrs), or on the
// addresses given to newFakeGatewaysAt, one port for all, and counts the
// connections open to them.
type fakeGateways struct {
	port  int
	state []atomic.Int32 // per address: gwReady, gwLinkDown or gwSilent
	open  atomic.Int32
	srv   []*http.Server
}

const (
	gwReady    = iota
	gwLinkDown // /ready answers 503
	gwSilent   // requests get no answer (a host that vanished)
)

func newFakeGateways(t *testing.T) *fakeGateways {
	return newFakeGatewaysAt(t, "127.0.1.2", "127.0.2.2")
}

// newFakeGatewaysAt serves fake gateways on addrs (127.0.1.x: site1's,
// whose peer is site2; others site2's).
func newFakeGatewaysAt(t *testing.T, addrs ...string) *fakeGateways {
	t.Helper()
	var lns []net.Listener
	for try := 0; len(lns) < len(addrs); try++ {
		if try == 20 {
			t.Fatalf("no port free on all of %v", addrs)
		}
		a, err := net.Listen("tcp", addrs[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := a.Addr().(*net.TCPAddr).Port
		lns = []net.Listener{a}
		for _, addr := range addrs[1:] {
			b, err := net.Listen("tcp", fmt.Sprintf("%s:%d", addr, port))
			if err != nil {
				for _, ln := range lns {
					ln.Close()
				}
				lns = nil
				break
			}
			lns = append(lns, b)
		}
	}
	f := &fakeGateways{port: lns[0].Addr().(*net.TCPAddr).Port, state: make([]atomic.Int32, len(lns))}
	for i, ln := range lns {
		mux := http.NewServeMux()
		mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
			switch f.state[i].Load() {
			case gwLinkDown:
				http.Error(w, "not ready", http.StatusServiceUnavailable)
			case gwSilent:
				<-r.Context().Done()
			default:
				fmt.Fprintln(w, "ready")
			}
		})
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
			peer := "site1"
			if strings.HasPrefix(addrs[i], "127.0.1.") {
				peer = "site2"
			}
			fmt.Fprintf(w, "mpi5k_wan_bytes_total{dir=\"tx\",link=\"0\",peer=%q} 2048\n", peer)
		})
		srv := &http.Server{Handler: mux, ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				f.open.Add(1)
			case http.StateClosed, http.StateHijacked:
				f.open.Add(-1)
			}
		}}
		f.srv = append(f.srv, srv)
		go srv.Serve(ln)
	}
	t.Cleanup(func() {
		for _, s := range f.srv {
			s.Close()
		}
	})
	return f
}

// runOthers starts a fake launcher script: a command that is not a
// gateway's (placing a key, removing it, copying the map) runs here.
const runOthers = "#!/bin/sh\ncase \"$*\" in *--site*) ;; *) shift; exec sh -c \"$*\";; esac\n"

// failfastConfig is a two-site run whose gateways are fake launchers
// running script (with $site set to site1 or site2) and whose mpirun runs
// the shell commands mpirun.
func failfastConfig(t *testing.T, f *fakeGateways, script, mpirun string) Config {
	t.Helper()
	dir := t.TempDir()
	launcher := writeFile(t, dir, "fake-ssh", runOthers+"case \"$*\" in *'--site site1'*) site=site1;; *) site=site2;; esac\n"+script+"\n")
	fake := writeFile(t, dir, "fake-mpiexec", "#!/bin/sh\n"+mpirun+"\n")
	c, _, _ := testConfig(t, fake, "-hosts", "node-1.site1,node-1.site2", "./app")
	c.Flavour = Hydra
	c.Launcher = []string{launcher}
	c.MetricsPort = f.port
	c.ReadyTimeout = 5 * time.Second
	return c
}

// runBounded runs c and fails t if Run takes longer than limit.
func runBounded(t *testing.T, c Config, limit time.Duration) (int, error, time.Duration) {
	t.Helper()
	type result struct {
		code int
		err  error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		code, err := Run(context.Background(), c)
		res <- result{code, err}
	}()
	select {
	case r := <-res:
		return r.code, r.err, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("Run has not returned after %v", limit)
		return 0, nil, 0
	}
}

// marked lists live processes whose command line contains marker.
func marked(marker string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), marker) {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if s := string(st); err != nil || strings.Contains(s[strings.LastIndexByte(s, ')'):], ") Z") {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		out = append(out, pid)
	}
	return out
}

// noneLeft fails t if a process with marker still runs (after a moment
// for the kernel to reap), and kills it.
func noneLeft(t *testing.T, marker string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for len(marked(marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, pid := range marked(marker) {
		t.Errorf("process %d (%s) left running", pid, marker)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// sleepMarker is a sleep duration unique to the test, so its processes can
// be found (and only them).
func sleepMarker(secs int) string {
	return fmt.Sprintf("%d.%d%d", secs, os.Getpid(), time.Now().UnixNano()%100000)
}

// A launcher whose background child keeps its output open after it exited
// (a daemon or rank left behind): the wrapper returns the launcher's
// status within seconds, and closes every connection it made to the
// gateways.
func TestRunLauncherChildHoldsOutput(t *testing.T) {
	f := newFakeGateways(t)
	bg := sleepMarker(30)
	c := failfastConfig(t, f, "exec sleep 300", "sleep "+bg+" & exit 4")
	code, err, took := runBounded(t, c, 20*time.Second)
	for _, pid := range marked(bg) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil || code != 4 {
		t.Fatalf("code %d err %v, want mpirun's 4", code, err)
	}
	// mpirun's end + pipeDelay + the gateways' stop after stdin EOF and SIGTERM.
	if limit := pipeDelay + stopEOF + 3*time.Second; took > limit {
		t.Errorf("Run took %v, want under %v", took, limit)
	}
	deadline := time.Now().Add(time.Second)
	for f.open.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := f.open.Load(); n != 0 {
		t.Errorf("%d connections to the gateways' HTTP endpoints left open after the run", n)
	}
}

// A gateway that ignores SIGTERM and stdin EOF is killed, and Run returns
// within the stop bounds.
func TestRunGatewayIgnoresTERM(t *testing.T) {
	f := newFakeGateways(t)
	gw := sleepMarker(300)
	c := failfastConfig(t, f, "trap '' TERM\nsleep "+gw+"\n", "exit 0")
	code, err, took := runBounded(t, c, 20*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("code %d err %v", code, err)
	}
	if limit := stopEOF + stopTERM + stopKILL + 2*time.Second; took > limit {
		t.Errorf("Run took %v, want under %v", took, limit)
	}
	noneLeft(t, gw)
}

// A gateway that dies while the job runs ends the job at once: ExitGatewayFailed,
// and a message naming the site, the host and its log's last lines.
func TestRunGatewayDiesDuringJob(t *testing.T) {
	f := newFakeGateways(t)
	rank := sleepMarker(60)
	c := failfastConfig(t, f, "if [ $site = site2 ]; then sleep 1; echo 'link down peer=site1 streams_reset=3'; exit 137; fi\nexec sleep 300",
		"sleep "+rank)
	code, err, took := runBounded(t, c, 30*time.Second)
	if code != ExitGatewayFailed || err == nil {
		t.Fatalf("code %d err %v, want %d and an error", code, err, ExitGatewayFailed)
	}
	for _, want := range []string{"site site2", "gateway on gw.site2", "exited during the job", "streams_reset=3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q:\n%v", want, err)
		}
	}
	if took > 8*time.Second {
		t.Errorf("Run took %v after a gateway died at 1 s", took)
	}
	noneLeft(t, rank)
}

// A gateway that stops answering, or answers that a WAN link is down, for
// the outage bound ends the job; a launcher that ignores SIGTERM is killed
// with its children.
func TestRunGatewayOutage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state int32
		want  string
	}{
		{"silent", gwSilent, "has not answered at 127.0.2.2:"},
		{"link down", gwLinkDown, "has reported a WAN link down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeGateways(t)
			rank := sleepMarker(60)
			c := failfastConfig(t, f, "exec sleep 300", "trap '' TERM; sleep "+rank+"; :")
			c.Outage = 2 * time.Second
			go func() {
				time.Sleep(time.Second) // the job is running
				f.state[1].Store(tc.state)
			}()
			code, err, took := runBounded(t, c, 30*time.Second)
			if code != ExitGatewayFailed || err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "site site2") {
				t.Fatalf("code %d err %v, want %d and %q", code, err, ExitGatewayFailed, tc.want)
			}
			// 1 s + the outage + a probe + mpiTERM + the gateways' stop.
			if limit := time.Second + c.Outage + probeTimeout + mpiTERM + stopEOF + 3*time.Second; took > limit {
				t.Errorf("Run took %v, want under %v", took, limit)
			}
			noneLeft(t, rank)
		})
	}
}

// An outage shorter than the bound does not end the job.
func TestRunGatewayShortOutage(t *testing.T) {
	f := newFakeGateways(t)
	c := failfastConfig(t, f, "exec sleep 300", "sleep 3; exit 0")
	c.Outage = 3 * time.Second
	go func() {
		time.Sleep(500 * time.Millisecond)
		f.state[1].Store(gwSilent)
		time.Sleep(1500 * time.Millisecond)
		f.state[1].Store(gwReady)
	}()
	code, err, _ := runBounded(t, c, 30*time.Second)
	if code != 0 || err != nil {
		t.Fatalf("code %d err %v, want the job's 0", code, err)
	}
}

// TestProbeAsks: the wrapper's /ready question names its job (tag) or
// the sites it needs, and with StartWhen StartLinks takes links not yet
// primed (primed=0); a gateway that answers 503 is not ready.
func TestProbeAsks(t *testing.T) {
	var asked atomic.Value
	primed := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.URL.RawQuery)
		if r.URL.Query().Get("primed") != "0" && !primed.Load() {
			http.Error(w, "not ready: a WAN link is down or being primed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	client := httpClient(time.Second)
	for _, c := range []struct {
		g     gateway
		query string
		ready bool
	}{
		{gateway{metrics: addr, tag: "job1"}, "tag=job1", false},
		{gateway{metrics: addr, tag: "job1", unprimed: true}, "primed=0&tag=job1", true},
		{gateway{metrics: addr, sites: "a,b", unprimed: true}, "primed=0&sites=a%2Cb", true},
		{gateway{metrics: addr}, "", false},
	} {
		err := c.g.probe(context.Background(), client)
		if q := asked.Load(); q != c.query {
			t.Errorf("asked /ready?%v, want ?%s", q, c.query)
		}
		if (err == nil) != c.ready {
			t.Errorf("?%s: ready %v (err %v), want %v", c.query, err == nil, err, c.ready)
		}
	}
	primed.Store(true)
	if err := (&gateway{metrics: addr, tag: "job1"}).probe(context.Background(), client); err != nil {
		t.Errorf("primed gateway not ready: %v", err)
	}
}
