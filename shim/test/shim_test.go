// Package shimtest tests libmpi5k.so from the outside: it builds the library
// and the C programs in c/, runs them with LD_PRELOAD against a fake gateway
// (fakegw_test.go) on loopback, and checks what they and the gateway saw.
// Loopback is pass-through by policy; MPI5K_TEST_ALLOW_LOOPBACK=1, set only
// here, lets 127.0.1.x (site a) and 127.0.2.x (site b) act as two sites.
package shimtest

import (
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/trace"
)

// builtEnv carries "lib:prog:gohost" into a re-executed test binary.
const builtEnv = "MPI5K_SHIMTEST_BUILT"

var (
	libPath    string // the built libmpi5k.so
	progPath   string // the built shimtest C program
	goHostPath string // the built gohost Go program (cgo)
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mpi5k-shimtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if p := os.Getenv(builtEnv); p != "" {
			// Re-executed by a test (e.g. in a network namespace of its
			// own): use the parent's builds.
			f := strings.Split(p, ":")
			libPath, progPath, goHostPath = f[0], f[1], f[2]
			return m.Run()
		}
		libPath = filepath.Join(dir, "libmpi5k.so")
		progPath = filepath.Join(dir, "shimtest")
		build := exec.Command("go", "build", "-buildmode=c-shared", "-o", libPath, "github.com/mpi5k/mpi5k/shim")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building libmpi5k.so:", err)
			return 1
		}
		cc := exec.Command("cc", "-O2", "-Wall", "-o", progPath, "c/shimtest.c", "-lpthread")
		cc.Stderr = os.Stderr
		if err := cc.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building c/shimtest.c:", err)
			return 1
		}
		goHostPath = filepath.Join(dir, "gohost")
		gb := exec.Command("go", "build", "-o", goHostPath, "github.com/mpi5k/mpi5k/shim/test/gohost")
		gb.Stderr = os.Stderr
		if err := gb.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building gohost:", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// lab is one test's two-site loopback world.
type lab struct {
	t       *testing.T
	dir     string
	mapPath string
	gw      *fakeGW
}

func newLab(t *testing.T) *lab {
	dir := t.TempDir()
	path, m := loopbackMap(t, dir)
	return &lab{t: t, dir: dir, mapPath: path, gw: startFakeGW(t, m)}
}

// env is the environment of a shimmed process at site.
func (l *lab) env(site string, extra ...string) []string {
	env := append(os.Environ(),
		"LD_PRELOAD="+libPath,
		"MPI5K_MAP="+l.mapPath,
		"MPI5K_SITE="+site,
		"MPI5K_TEST_ALLOW_LOOPBACK=1",
		"GODEBUG=asyncpreemptoff=1",
	)
	return append(env, extra...)
}

// run runs the C program with env and returns its stdout; the test fails if
// it exits non-zero (stderr is shown).
func run(t *testing.T, env []string, timeout time.Duration, args ...string) string {
	t.Helper()
	out, errOut, err := runErr(env, timeout, args...)
	if err != nil {
		t.Fatalf("shimtest %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func runErr(env []string, timeout time.Duration, args ...string) (string, string, error) {
	cmd := exec.Command(progPath, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return "", "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), errb.String(), err
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return out.String(), errb.String(), fmt.Errorf("timed out after %v", timeout)
	}
}

const srcA = "127.0.1.1" // a rank of site a

func TestRelayedConnect(t *testing.T) {
	l := newLab(t)
	port, acc := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	if n := l.gw.opens.Load(); n != 1 {
		t.Errorf("gateway saw %d OPENs, want 1", n)
	}
	if n := l.gw.badSrc.Load(); n != 0 {
		t.Errorf("%d OPENs carried a source outside site a (bind not honoured?)", n)
	}
	// the gateway counts a direction when it ends, which may be just after
	// the client exits
	for i := 0; i < 100 && l.gw.bytes.Load() < 200; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if acc.Load() != 1 || l.gw.bytes.Load() != 200 {
		t.Errorf("server accepted %d, gateway relayed %d bytes; want 1, 200", acc.Load(), l.gw.bytes.Load())
	}
}

func TestRelayedConnectIPv6Socket(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 20*time.Second, "conn6", srcA, "127.0.2.1", fmt.Sprint(port))
	if n, bad := l.gw.opens.Load(), l.gw.badSrc.Load(); n != 1 || bad != 0 {
		t.Errorf("gateway saw %d OPENs (%d with a bad source), want 1 (0)", n, bad)
	}
}

// TestNoStrayFds: an active, tracing shim that relayed a connection leaves
// the host exactly the fds it would have without the shim (its own are
// >= 900): no cgroup files, no netpoll epoll/eventfd.
func TestNoStrayFds(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	args := []string{"fdlist", srcA, "127.0.2.1", fmt.Sprint(port)}
	bare := run(t, append(os.Environ(), "MPI5K_TEST_ALLOW_LOOPBACK=1"), 20*time.Second, args...)
	shimmed := run(t, l.env("a", "MPI5K_TRACE="+t.TempDir()), 20*time.Second, args...)
	if bare != shimmed {
		t.Errorf("open fds below 900: bare %q, shimmed %q", bare, shimmed)
	}
	if l.gw.opens.Load() != 1 {
		t.Errorf("gateway saw %d OPENs, want 1", l.gw.opens.Load())
	}
}

func TestPassThrough(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.1.2:0")
	// same site
	run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.1.2", fmt.Sprint(port))
	// no map: the library does nothing even for another site
	port2, _ := echoServer(t, "127.0.2.1:0")
	env := append(os.Environ(), "LD_PRELOAD="+libPath, "MPI5K_TEST_ALLOW_LOOPBACK=1", "MPI5K_SITE=a")
	run(t, env, 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port2))
	// loopback without the test switch is never relayed
	env = append(os.Environ(), "LD_PRELOAD="+libPath, "MPI5K_MAP="+l.mapPath, "MPI5K_SITE=a")
	run(t, env, 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port2))
	if n := l.gw.opens.Load(); n != 0 {
		t.Errorf("gateway saw %d OPENs for pass-through connections, want 0", n)
	}
}

func TestAcceptTruePeer(t *testing.T) {
	l := newLab(t)
	port := freePort(t, "127.0.2.1")
	const n = 20
	srvWait := startServe(t, l, port, n)
	for i := 0; i < n; i++ {
		run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	}
	srvWait()
	if q, f := l.gw.queries.Load(), l.gw.found.Load(); q != n || f != n {
		t.Errorf("peer queries %d found %d, want %d", q, f, n)
	}
}

// TestListenRegisters: a shimmed server's listen() registers its port
// with its site's gateway before it returns (the server prints
// "listening" after listen), and the registration ends with the process.
func TestListenRegisters(t *testing.T) {
	l := newLab(t)
	port := freePort(t, "127.0.2.1")
	ap := netip.AddrPortFrom(netip.MustParseAddr("127.0.2.1"), uint16(port))
	srvWait := startServe(t, l, port, 1)
	if !l.gw.registered(ap.Port()) {
		t.Fatalf("listen() returned before %v was registered with site b's gateway", ap)
	}
	run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	srvWait()
	deadline := time.Now().Add(5 * time.Second)
	for l.gw.registered(ap.Port()) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l.gw.registered(ap.Port()) {
		t.Errorf("%v stays registered after the server exited", ap)
	}
}

// startServe starts the test program's "serve" (site b, expecting n
// connections from site a's addresses) on 127.0.2.1:port, waits until it
// listens, and returns a function that waits for it to finish.
func startServe(t *testing.T, l *lab, port, n int) (wait func()) {
	t.Helper()
	_, wait = startServer(t, l, "serve", "127.0.2.1", fmt.Sprint(port), fmt.Sprint(n), "127.0.1.")
	return wait
}

// startServer starts the test program with args at site b, waits until it
// listens, and returns its stdout and a function that waits for it to
// finish.
func startServer(t *testing.T, l *lab, args ...string) (stdout *bytes.Buffer, wait func()) {
	t.Helper()
	srv := exec.Command(progPath, args...)
	srv.Env = l.env("b")
	var sout, serr bytes.Buffer
	srv.Stdout, srv.Stderr = &sout, &serr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill() })
	waitListening(t, &sout)
	return &sout, func() {
		t.Helper()
		if err := srv.Wait(); err != nil {
			t.Fatalf("server: %v\n%s\n%s", err, sout.String(), serr.String())
		}
	}
}

func waitListening(t *testing.T, out *bytes.Buffer) {
	for i := 0; i < 200; i++ {
		if strings.Contains(out.String(), "listening") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("server did not start listening")
}

func TestForkWithoutExec(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	out := run(t, l.env("a"), 120*time.Second, "fork", "100", srcA, "127.0.2.1", fmt.Sprint(port))
	if !strings.Contains(out, "fork ok=100/100") {
		t.Errorf("got %q", out)
	}
}

func TestForkExec(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 20*time.Second, "forkexec", srcA, "127.0.2.1", fmt.Sprint(port), progPath)
	if n := l.gw.opens.Load(); n != 1 {
		t.Errorf("the exec'd child made %d relayed connections, want 1", n)
	}
}

func TestThreads(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 60*time.Second, "threads", "64", "5", srcA, "127.0.2.1", fmt.Sprint(port))
	if n := l.gw.opens.Load(); n != 64*5 {
		t.Errorf("gateway saw %d OPENs, want %d", n, 64*5)
	}
}

func TestDup(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 20*time.Second, "dup", srcA, "127.0.2.1", fmt.Sprint(port))
}

func TestErrno(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	dead := freePort(t, "127.0.2.1")
	run(t, l.env("a"), 20*time.Second, "errno", srcA, "127.0.2.1", fmt.Sprint(port), fmt.Sprint(dead))
}

func TestGatewayDown(t *testing.T) {
	l := newLab(t)
	l.gw.close() // no gateway at all
	port, acc := echoServer(t, "127.0.2.1:0")
	_, errOut, err := runErr(l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	if err == nil {
		t.Fatal("connect succeeded with the gateway down")
	}
	if !strings.Contains(errOut, "Connection refused") || !strings.Contains(errOut, "cannot reach gateway 127.0.1.254") ||
		!strings.Contains(errOut, l.mapPath) {
		t.Errorf("stderr does not name the errno, gateway and map:\n%s", errOut)
	}
	if strings.Count(errOut, "mpi5k[") != 1 {
		t.Errorf("want exactly one mpi5k line:\n%s", errOut)
	}
	run(t, l.env("a", "MPI5K_FALLBACK=direct"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	if acc.Load() != 1 {
		t.Errorf("fallback: server accepted %d, want 1", acc.Load())
	}
}

func TestStress(t *testing.T) {
	l := newLab(t)
	port := freePort(t, "127.0.2.1")
	const n = 200
	srvWait := startServe(t, l, port, n)
	out := run(t, l.env("a"), 120*time.Second, "stress", fmt.Sprint(n), srcA, "127.0.2.1", fmt.Sprint(port), "12345", fmt.Sprint(2<<20))
	t.Log(strings.TrimSpace(out))
	srvWait()
	if !strings.Contains(out, fmt.Sprintf("stress ok=%d/%d", n, n)) {
		t.Errorf("got %q", out)
	}
	if o := l.gw.opens.Load(); o != n {
		t.Errorf("gateway saw %d OPENs, want %d", o, n)
	}
}

// traceConn runs the "conn" client (connect through the gateway, write and
// read 100 bytes, close) with tracing on and extra env, and opens the one
// trace file it must have written; it also returns the echo server's port.
func traceConn(t *testing.T, env ...string) (*trace.Reader, int) {
	t.Helper()
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	dir := t.TempDir()
	run(t, l.env("a", append([]string{"MPI5K_TRACE=" + dir}, env...)...), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	files, _ := filepath.Glob(filepath.Join(dir, "*.trace"))
	if len(files) != 1 {
		t.Fatalf("want one trace file, got %v", files)
	}
	f, err := os.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r, err := trace.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return r, port
}

func TestTrace(t *testing.T) {
	r, port := traceConn(t)
	if r.Header.Site != "a" || r.Header.SiteID != 1 || r.Header.PID == 0 {
		t.Errorf("header %+v", r.Header)
	}
	var conns, wrote, read int
	var sawClose bool
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case rec.Kind == trace.KindConn && rec.Fn == trace.FnConnect:
			conns++
			if rec.Peer.String() != fmt.Sprintf("127.0.2.1:%d", port) || rec.Local.Addr().String() != srcA || rec.Flags&trace.FlagRelayed == 0 {
				t.Errorf("conn record %+v", rec)
			}
		case rec.Kind == trace.KindCall && rec.Fn == trace.FnWrite:
			wrote += int(rec.Ret)
		case rec.Kind == trace.KindCall && rec.Fn == trace.FnRead:
			read += int(rec.Ret)
		case rec.Kind == trace.KindCall && rec.Fn == trace.FnClose:
			sawClose = true
		}
	}
	if conns != 1 || wrote != 100 || read != 100 || !sawClose {
		t.Errorf("conn records %d, bytes written %d read %d, close %v; want 1, 100, 100, true", conns, wrote, read, sawClose)
	}
}

// TestGoHostPassive: in a (cgo) Go program the shim finds the other Go
// runtime and stays passive: the connect to another site goes direct.
func TestGoHostPassive(t *testing.T) {
	l := newLab(t)
	port, acc := echoServer(t, "127.0.2.1:0")
	cmd := exec.Command(goHostPath, srcA, "127.0.2.1", fmt.Sprint(port))
	cmd.Env = l.env("a")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "gohost ok") {
		t.Fatalf("gohost: %v\n%s", err, out)
	}
	if n := l.gw.opens.Load(); n != 0 || acc.Load() != 1 {
		t.Errorf("gateway saw %d OPENs (want 0), server accepted %d (want 1)", n, acc.Load())
	}
}

// TestGodebugInPlace: an existing GODEBUG gets asyncpreemptoff=1 appended
// before the shim's Go runtime reads it (the runtime logs what it sees).
func TestGodebugInPlace(t *testing.T) {
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	env := []string{}
	for _, e := range l.env("a", "MPI5K_LOG=debug") {
		if !strings.HasPrefix(e, "GODEBUG=") {
			env = append(env, e)
		}
	}
	_, errOut, err := runErr(append(env, "GODEBUG=madvdontneed=1"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "GODEBUG=madvdontneed=1,asyncpreemptoff=1") {
		t.Errorf("the runtime did not see asyncpreemptoff=1:\n%s", errOut)
	}
}

// TestNoPreemptSignals: the shim's Go runtime sends preemption signals
// (SIGURG) at start-up unless GODEBUG has asyncpreemptoff=1; a host with
// its own SIGURG handler (orterun) then receives them. With GODEBUG present
// (even empty) the shim adds the setting in place, also when passive.
// Without GODEBUG (what docs/shim.md tells launchers to avoid) the signals
// reach the host's handler, which runs without Go's signal stack and can
// crash the process: those runs are counted, not required to succeed.
func TestNoPreemptSignals(t *testing.T) {
	l := newLab(t)
	strip := func(env []string) []string {
		var out []string
		for _, e := range env {
			if !strings.HasPrefix(e, "GODEBUG=") {
				out = append(out, e)
			}
		}
		return out
	}
	passive := strip(append(os.Environ(), "LD_PRELOAD="+libPath))
	active := strip(l.env("a"))
	unfixed, crashed := 0, 0
	for i := 0; i < 5; i++ {
		for name, env := range map[string][]string{"passive": passive, "active": active} {
			out := run(t, append(env, "GODEBUG="), 20*time.Second, "sigurg")
			if strings.TrimSpace(out) != "sigurg=0" {
				t.Errorf("%s shim with GODEBUG= : host got %s", name, strings.TrimSpace(out))
			}
		}
		out, errOut, err := runErr(passive, 20*time.Second, "sigurg")
		if err != nil {
			crashed++
			line, _, _ := strings.Cut(strings.TrimSpace(errOut), "\n")
			t.Logf("without GODEBUG the host died (%v): %s", err, line)
			continue
		}
		var n int
		fmt.Sscanf(strings.TrimSpace(out), "sigurg=%d", &n)
		unfixed += n
	}
	t.Logf("without GODEBUG in the environment the host received %d SIGURGs in 5 runs and died in %d", unfixed, crashed)
}

// TestSeveralGateways: with two gateway hosts for site a, one process's
// relayed connections are spread over both; with one of them gone, new
// connections go through the other at once, and none fails.
func TestSeveralGateways(t *testing.T) {
	dir := t.TempDir()
	path, m := twoGatewayMap(t, dir)
	l := &lab{t: t, dir: dir, mapPath: path, gw: startFakeGW(t, m)}
	a, _ := m.Site("a")
	port, _ := echoServer(t, "127.0.2.1:0")
	run(t, l.env("a"), 60*time.Second, "threads", "4", "5", srcA, "127.0.2.1", fmt.Sprint(port))
	for i, gw := range a.Gateways {
		if n := l.gw.opensAt[gw.LAN].Load(); n == 0 {
			t.Errorf("gateway %d (%v) of site a got none of 20 connections", i, gw.LAN)
		}
	}
	if n := l.gw.opens.Load(); n != 20 {
		t.Fatalf("gateways saw %d OPENs, want 20", n)
	}
	// Gateway 0 goes away: every new connection, whichever gateway its
	// process starts at, goes through gateway 1.
	l.gw.lnAt[a.Gateways[0].LAN].Close()
	before := l.gw.opensAt[a.Gateways[1].LAN].Load()
	for range 6 {
		run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	}
	run(t, l.env("a"), 60*time.Second, "threads", "4", "5", srcA, "127.0.2.1", fmt.Sprint(port))
	if n := l.gw.opensAt[a.Gateways[1].LAN].Load() - before; n != 26 {
		t.Errorf("gateway 1 took %d of the 26 connections made while gateway 0 was down", n)
	}
}

// TestListenRegistersWithEveryGateway: a rank's listen() registers its
// port with each gateway of its site, since either may deliver a stream
// to it, and accepted relayed connections from either are recognised
// (PEER_QUERY to the gateway they come from).
func TestListenRegistersWithEveryGateway(t *testing.T) {
	dir := t.TempDir()
	path, m := twoGatewayMap(t, dir)
	l := &lab{t: t, dir: dir, mapPath: path, gw: startFakeGW(t, m)}
	b, _ := m.Site("b")
	port := freePort(t, "127.0.2.1")
	// 16 processes, each starting at a random gateway: all at one has
	// odds of 2^-15.
	const n = 16
	srvWait := startServe(t, l, port, n)
	for i, gw := range b.Gateways {
		if k := l.gw.listensAt[gw.LAN].Load(); k != 1 {
			t.Errorf("gateway %d of site b (%v) got %d LISTEN, want 1 before listen() returned", i, gw.LAN, k)
		}
	}
	for range n {
		run(t, l.env("a"), 20*time.Second, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	}
	srvWait()
	if q, f, e := l.gw.queries.Load(), l.gw.found.Load(), l.gw.queriesElsewhere.Load(); q != n || f != n || e != 0 {
		t.Errorf("peer queries %d found %d (%d to another gateway than the connection's), want %d, %d, 0", q, f, e, n, n)
	}
	a, _ := m.Site("a")
	for i, gw := range a.Gateways {
		if l.gw.opensAt[gw.LAN].Load() == 0 {
			t.Errorf("gateway %d of site a took none of %d connections: site b's gateway %d delivered none", i, n, i)
		}
	}
}

// TestOpenMPIPortMin: a shimmed process gets Open MPI's TCP BTL listening
// from 32768, inside the gateways' default --lan-listen-ports, unless the
// job set the parameter; without a site map the shim sets nothing.
func TestOpenMPIPortMin(t *testing.T) {
	l := newLab(t)
	envOf := func(env []string) string {
		cmd := exec.Command("env")
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	if out := envOf(l.env("a")); !strings.Contains(out, "OMPI_MCA_btl_tcp_port_min_v4=32768\n") ||
		!strings.Contains(out, "OMPI_MCA_btl_tcp_port_min_v6=32768\n") {
		t.Errorf("shimmed environment lacks the BTL's port minimum:\n%s", out)
	}
	if out := envOf(l.env("a", "OMPI_MCA_btl_tcp_port_min_v4=40000")); !strings.Contains(out, "OMPI_MCA_btl_tcp_port_min_v4=40000\n") {
		t.Errorf("the job's own port minimum was replaced:\n%s", out)
	}
	if out := envOf(append(os.Environ(), "LD_PRELOAD="+libPath)); strings.Contains(out, "OMPI_MCA_btl_tcp_port_min") &&
		os.Getenv("OMPI_MCA_btl_tcp_port_min_v4") == "" {
		t.Errorf("a shim without a site map set the BTL's port minimum:\n%s", out)
	}
}
