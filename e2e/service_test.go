package e2e

// Gateways as a site service (issue 31): one gateway per site started once
// with the unit's command line, serving concurrent jobs, reloading its
// site map on SIGHUP mid-transfer and draining on SIGTERM.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
)

// TestServiceTraffic is not a test: it is the checksummed-stream program
// run inside lab hosts when MPI5K_SVCTRAFFIC is set: "serve ADDR" (a
// SumServer), or "send DST GW SIZE SEED": open DST through the gateway's
// LAN listener GW, send half of SIZE bytes, print "half", wait for a line
// on standard input, send the rest and print "ok" if the SHA-256 came back
// right.
func TestServiceTraffic(t *testing.T) {
	spec := os.Getenv("MPI5K_SVCTRAFFIC")
	if spec == "" {
		t.Skip("traffic process only")
	}
	if err := svcTraffic(strings.Fields(spec)); err != nil {
		fmt.Fprintln(os.Stderr, "traffic:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func svcTraffic(a []string) error {
	switch a[0] {
	case "serve":
		return serveSums(a[1])
	case "send":
		c, err := helperDial(a[1], a[2])
		if err != nil {
			return err
		}
		size, _ := strconv.Atoi(a[3])
		seed, _ := strconv.ParseUint(a[4], 10, 64)
		r := rand.New(rand.NewPCG(seed, 2))
		h := sha256.New()
		buf := make([]byte, 64<<10)
		send := func(n int) error {
			for n > 0 {
				k := min(n, len(buf))
				testnet.Fill(r, buf[:k])
				h.Write(buf[:k])
				if _, err := c.Write(buf[:k]); err != nil {
					return err
				}
				n -= k
			}
			return nil
		}
		if err := send(size / 2); err != nil {
			return fmt.Errorf("first half: %w", err)
		}
		fmt.Println("half")
		bufio.NewReader(os.Stdin).ReadString('\n')
		if err := send(size - size/2); err != nil {
			return fmt.Errorf("second half: %w", err)
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			return fmt.Errorf("reading the checksum: %w", err)
		}
		if !bytes.Equal(got, h.Sum(nil)) {
			return fmt.Errorf("checksum mismatch (%d bytes back)", len(got))
		}
		fmt.Println("ok")
		return nil
	}
	return fmt.Errorf("unknown traffic mode %q", a[0])
}

// gatedSend is a running "send" traffic process, stopped after its first half.
type gatedSend struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *lockedBuffer
	what  string
	exit  chan error
	begun bool
}

// startSend starts a checksummed stream from host to dst through gw and
// waits until its first half is sent.
func startSend(t *testing.T, l *testbed.Lab, host string, dst, gw netip.AddrPort, size int, seed uint64) *gatedSend {
	t.Helper()
	c := l.Command(host, os.Args[0], "-test.run=^TestServiceTraffic$")
	// The sender speaks to the gateway itself: no shim under it.
	c.Env = slices.DeleteFunc(c.Env, func(e string) bool { return strings.HasPrefix(e, "LD_PRELOAD=") })
	c.Env = append(c.Env, fmt.Sprintf("MPI5K_SVCTRAFFIC=send %v %v %d %d", dst, gw, size, seed))
	s := &gatedSend{cmd: c, out: &lockedBuffer{want: "half", seen: make(chan struct{})}, exit: make(chan error, 1),
		what: fmt.Sprintf("stream %s -> %v (%d bytes)", host, dst, size)}
	seen := s.out.seen
	c.Stdout, c.Stderr = s.out, s.out
	s.in, _ = c.StdinPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); <-s.exit })
	go func() { s.exit <- c.Wait() }()
	select {
	case <-seen:
		s.begun = true
	case err := <-s.exit:
		s.exit <- err
	case <-time.After(30 * time.Second):
	}
	return s
}

// finish sends the second half and reports whether the checksum matched.
func (s *gatedSend) finish() error {
	if !s.begun {
		return fmt.Errorf("%s: first half not sent: %s", s.what, s.out.String())
	}
	io.WriteString(s.in, "go\n")
	select {
	case err := <-s.exit:
		s.exit <- err
		if err != nil || !strings.Contains(s.out.String(), "ok") {
			return fmt.Errorf("%s: %v: %s", s.what, err, s.out.String())
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("%s: not done 60 s after its second half", s.what)
	}
}

// unitCommand is the unit's ExecStart line (dist/mpi5k-gateway.service.in)
// as systemd runs it with env (the EnvironmentFile's settings): ${VAR} is
// one word, $VAR splits at whitespace.
func unitCommand(t *testing.T, bindir string, env map[string]string) []string {
	t.Helper()
	b, err := os.ReadFile("../dist/mpi5k-gateway.service.in")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			line = strings.ReplaceAll(v, "@BINDIR@", bindir)
		}
	}
	if line == "" {
		t.Fatal("the unit has no ExecStart= line")
	}
	var argv []string
	for _, w := range strings.Fields(line) {
		switch {
		case strings.HasPrefix(w, "${") && strings.HasSuffix(w, "}"):
			argv = append(argv, env[w[2:len(w)-1]])
		case strings.HasPrefix(w, "$"):
			argv = append(argv, strings.Fields(env[w[1:]])...)
		default:
			argv = append(argv, w)
		}
	}
	return argv
}

// readEnvFile reads an EnvironmentFile= (KEY=VALUE lines, # comments).
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			env[k] = v
		}
	}
	return env
}

// serviceGW is a gateway started as the unit starts it.
type serviceGW struct {
	site string
	cmd  *exec.Cmd
	log  string
	exit chan error
}

func (g *serviceGW) logText() string { b, _ := os.ReadFile(g.log); return string(b) }

// waitLog waits up to d for the gateway's log to contain s.
func (g *serviceGW) waitLog(s string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if strings.Contains(g.logText(), s) {
			return true
		}
	}
	return false
}

// startServiceGateways writes each site's gateway.env from dist's (map,
// site, a ready file, the helper servers' ports allowed, extra with GWADDR
// and GWSITE replaced by the gateway's address and site), starts the
// unit's command line in each site's gateway host with stderr to a log
// (the journal) and waits until all are ready.
func startServiceGateways(t *testing.T, l *testbed.Lab, mapPath, dir string, extra ...string) map[string]*serviceGW {
	t.Helper()
	_, gwBin := shimBins(t)
	tmpl := readEnvFile(t, "../dist/gateway.env")
	gws := map[string]*serviceGW{}
	for _, site := range l.Sites() {
		env := map[string]string{}
		for k, v := range tmpl {
			env[k] = v
		}
		ready := filepath.Join(dir, site+".ready")
		env["MPI5K_MAP"], env["MPI5K_SITE"] = mapPath, site
		env["MPI5K_GATEWAY_ARGS"] = strings.Join(append([]string{"--ready-file", ready, "--wan-allow-ports", helperPorts}, extra...), " ")
		env["MPI5K_GATEWAY_ARGS"] = strings.ReplaceAll(env["MPI5K_GATEWAY_ARGS"], "GWADDR", l.Addr(l.Gateway(site)).String())
		env["MPI5K_GATEWAY_ARGS"] = strings.ReplaceAll(env["MPI5K_GATEWAY_ARGS"], "GWSITE", site)
		argv := unitCommand(t, filepath.Dir(gwBin), env)
		g := &serviceGW{site: site, log: filepath.Join(dir, site+".log"), exit: make(chan error, 1)}
		logf, err := os.Create(g.log)
		if err != nil {
			t.Fatal(err)
		}
		g.cmd = l.Command(l.Gateway(site), argv[0], argv[1:]...)
		g.cmd.Stdout, g.cmd.Stderr = logf, logf
		if err := g.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", site, strings.Join(argv, " "))
		go func() { g.exit <- g.cmd.Wait(); logf.Close() }()
		t.Cleanup(func() {
			select {
			case err := <-g.exit:
				g.exit <- err
			default:
				g.cmd.Process.Kill()
			}
			if t.Failed() {
				t.Logf("gateway %s log:\n%s", site, lastLines(g.logText(), 30))
			}
		})
		gws[site] = g
	}
	deadline := time.Now().Add(30 * time.Second)
	for site := range gws {
		for {
			if _, err := os.Stat(filepath.Join(dir, site+".ready")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %s not ready within 30 s:\n%s", site, gws[site].logText())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return gws
}

// withoutSite is the site map text without site's records.
func withoutSite(text, site string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[1] == site && (f[0] == "site" || f[0] == "key" || f[0] == "net" || f[0] == "host") {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// TestServiceGateways: three sites' gateways started once with the unit's
// command line; an Open MPI job and an MPICH job at the same time through
// them (both verify their payloads); the site map edited (site3 removed)
// and reloaded with SIGHUP while four checksummed streams are half-sent
// and the jobs run: every stream ends intact, site3 is refused afterwards;
// then SIGTERM while a stream is half-sent: it ends intact and every
// gateway exits 0.
func TestServiceGateways(t *testing.T) {
	labRequireRoot(t)
	lib, _ := shimBins(t)
	l := labUp(t, testbed.Config{Name: fmt.Sprintf("svc%d", os.Getpid()%10000), Sites: []string{"site1", "site2", "site3"},
		Nodes: 2, RTT: 10 * time.Millisecond, WANRate: 200e6})
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	// The gateways' map: a copy the test edits, as an operator edits
	// /etc/mpi5k/sites.map, keyed as a deployment is (a key per site,
	// docs/security.md). The ranks' shims keep the lab's.
	orig, err := os.ReadFile(l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Sites() {
		pub, err := gateway.GenerateKey(filepath.Join(dir, s+".key"))
		if err != nil {
			t.Fatal(err)
		}
		orig = append(orig, "key "+s+" "+sitemap.FormatKey(pub)+"\n"...)
	}
	mapPath := filepath.Join(dir, "sites.map")
	if err := os.WriteFile(mapPath, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := sitemap.Parse(bytes.NewReader(orig), "lab map")
	if err != nil {
		t.Fatal(err)
	}
	gws := startServiceGateways(t, l, mapPath, dir, "--key", filepath.Join(dir, "GWSITE.key"))
	lanOf := func(site string) netip.AddrPort { s, _ := m.Site(site); return s.LAN }

	// Sinks for the checksummed streams.
	for _, host := range []string{"node-1.site2", "node-1.site3"} {
		c := l.Command(host, os.Args[0], "-test.run=^TestServiceTraffic$")
		c.Env = append(c.Env, "MPI5K_SVCTRAFFIC=serve "+netip.AddrPortFrom(l.Addr(host), 7100).String())
		out, _ := c.StdoutPipe()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		if line, _ := bufio.NewReader(out).ReadString('\n'); !strings.HasPrefix(line, "listening") {
			t.Fatalf("sink on %s did not start", host)
		}
	}
	sink := func(host string) netip.AddrPort { return netip.AddrPortFrom(l.Addr(host), 7100) }

	// Both MPIs at once, each ping-ponging checked 64 KiB messages for 25 s
	// between site1 and site2 through the service gateways.
	for k, v := range map[string]string{"LD_PRELOAD": lib, "MPI5K_MAP": l.SiteMapPath(), "GODEBUG": "asyncpreemptoff=1"} {
		t.Setenv(k, v)
	}
	jobs := map[string][]string{
		"openmpi": {"mpirun.openmpi", "--allow-run-as-root", "-np", "2", "-H", "node-1.site1,node-1.site2",
			"--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "mpi_yield_when_idle", "1",
			"--mca", "btl_tcp_if_include", testbed.LANCIDR, "--mca", "oob_tcp_if_include", testbed.LANCIDR,
			"-x", "LD_PRELOAD", "-x", "MPI5K_MAP", "-x", "GODEBUG", buildMPI(t, "mpicc.openmpi", "chaos_mpi"), "25"},
		"mpich": {"mpiexec.mpich", "-launcher", "ssh", "-hosts", "node-2.site1,node-2.site2", "-n", "2",
			"-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0",
			"-genv", "LD_PRELOAD", lib, "-genv", "MPI5K_MAP", l.SiteMapPath(), "-genv", "GODEBUG", "asyncpreemptoff=1",
			buildMPI(t, "mpicc.mpich", "chaos_mpi"), "25"},
	}
	type job struct {
		cmd  *exec.Cmd
		out  *lockedBuffer
		exit chan error
	}
	running := map[string]*job{}
	for name, argv := range jobs {
		j := &job{out: &lockedBuffer{}, exit: make(chan error, 1)}
		j.cmd = l.Command(strings.Split(argv[slicesIndex(argv, "-H", "-hosts")+1], ",")[0], argv[0], argv[1:]...)
		j.cmd.Dir = dir
		j.cmd.Stdout, j.cmd.Stderr = j.out, j.out
		j.cmd.WaitDelay = 5 * time.Second
		if err := j.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { j.exit <- j.cmd.Wait() }()
		t.Cleanup(func() {
			select {
			case err := <-j.exit:
				j.exit <- err
			default:
				j.cmd.Process.Signal(syscall.SIGINT)
				select {
				case <-j.exit:
				case <-time.After(10 * time.Second):
					j.cmd.Process.Kill()
				}
			}
		})
		running[name] = j
	}
	for name, j := range running {
		for end := time.Now().Add(60 * time.Second); !strings.Contains(j.out.String(), "chaos_mpi running"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s job did not start:\n%s", name, j.out.String())
			}
		}
	}

	// Four streams half-sent, then the edited map reloaded.
	var streams []*gatedSend
	for i := range 4 {
		streams = append(streams, startSend(t, l, "node-2.site1", sink("node-1.site2"), lanOf("site1"), 32<<20, uint64(i)))
	}
	streams = append(streams, startSend(t, l, "node-1.site2", sink("node-1.site3"), lanOf("site2"), 16<<20, 7))
	if err := os.WriteFile(mapPath+".new", []byte(withoutSite(string(orig), "site3")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mapPath+".new", mapPath); err != nil {
		t.Fatal(err)
	}
	reloaded := time.Now()
	for _, site := range []string{"site1", "site2"} {
		gws[site].cmd.Process.Signal(syscall.SIGHUP)
	}
	for _, site := range []string{"site1", "site2"} {
		if !gws[site].waitLog("changes=\"removed site3\"", 10*time.Second) {
			t.Fatalf("gateway %s did not log the reload:\n%s", site, lastLines(gws[site].logText(), 20))
		}
	}
	for _, s := range streams {
		if err := s.finish(); err != nil {
			t.Errorf("across the reload: %v", err)
		}
	}
	t.Logf("%d streams half-sent at the reload ended intact %v after it", len(streams), time.Since(reloaded).Round(time.Millisecond))
	if !gws["site2"].waitLog("removed peer's WAN links closed", 10*time.Second) {
		t.Errorf("site2's links to the removed site3 did not close")
	}
	if s := startSend(t, l, "node-1.site1", sink("node-1.site3"), lanOf("site1"), 1<<20, 20); s.begun {
		if err := s.finish(); err == nil {
			t.Errorf("a stream to site3 went through after site3 left site1's map")
		}
	}
	if err := startSend(t, l, "node-1.site1", sink("node-1.site2"), lanOf("site1"), 1<<20, 21).finish(); err != nil {
		t.Errorf("after the reload: %v", err)
	}

	for name, j := range running {
		select {
		case err := <-j.exit:
			out := j.out.String()
			if err != nil || !strings.Contains(out, "chaos_mpi ok") {
				t.Errorf("%s job: %v\n%s", name, err, lastLines(out, 10))
			} else {
				t.Logf("%s job: %s", name, strings.TrimSpace(lastLines(out, 1)))
			}
			j.exit <- err
		case <-time.After(60 * time.Second):
			if name == "mpich" && strings.Contains(j.out.String(), "chaos_mpi ok") {
				t.Logf("mpich job verified, then hung in MPI_Finalize (openucx/ucx#8738)")
				continue
			}
			t.Errorf("%s job not done:\n%s", name, lastLines(j.out.String(), 10))
		}
	}

	// SIGTERM with a stream half-sent: it finishes, the gateways exit 0.
	last := startSend(t, l, "node-1.site1", sink("node-1.site2"), lanOf("site1"), 16<<20, 30)
	stopped := time.Now()
	for _, g := range gws {
		g.cmd.Process.Signal(syscall.SIGTERM)
	}
	if err := last.finish(); err != nil {
		t.Errorf("stream half-sent at SIGTERM: %v", err)
	}
	for site, g := range gws {
		select {
		case err := <-g.exit:
			if err != nil {
				t.Errorf("gateway %s after SIGTERM: %v, want exit 0", site, err)
			}
			g.exit <- err
		case <-time.After(20 * time.Second):
			t.Errorf("gateway %s still running 20 s after SIGTERM", site)
		}
	}
	t.Logf("gateways drained and exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if !strings.Contains(gws["site1"].logText(), "gateway stopped") {
		t.Errorf("site1's log lacks the stop:\n%s", lastLines(gws["site1"].logText(), 10))
	}
}

// slicesIndex is the index of the first of words in argv (-1: none).
func slicesIndex(argv []string, words ...string) int {
	for i, a := range argv {
		for _, w := range words {
			if a == w {
				return i
			}
		}
	}
	return -1
}

// withReady is the site map text with ready=GW:port on every site record
// (the service gateways' --metrics listener on their LAN address).
func withReady(t *testing.T, l *testbed.Lab, text string, port int) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "site" {
			line = strings.TrimSpace(strings.SplitN(line, "#", 2)[0]) + fmt.Sprintf(" ready=%v", netip.AddrPortFrom(l.Addr(l.Gateway(f[1])), uint16(port)))
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// TestRunUsesServiceGateways: `mpi5k run --map FILE` with a hand-written
// map (the lab's: nets, gateways with separate LAN and WAN addresses) whose
// sites name their running gateways (ready=) uses them and starts none;
// with those gateways stopped, the same run starts per-job gateways on the
// map's listeners. Both jobs verify their payloads.
func TestRunUsesServiceGateways(t *testing.T) {
	labRequireRoot(t)
	l := labUp(t, testbed.Config{Name: fmt.Sprintf("svr%d", os.Getpid()%10000), Nodes: 1, RTT: 10 * time.Millisecond, WANRate: 100e6})
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	orig, err := os.ReadFile(l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	mapPath := filepath.Join(dir, "sites.map")
	if err := os.WriteFile(mapPath, []byte(withReady(t, l, string(orig), 9105)), 0o644); err != nil {
		t.Fatal(err)
	}
	gws := startServiceGateways(t, l, mapPath, dir, "--metrics", "GWADDR:9105")
	m := chaosMPIs[0]
	bin := buildMPI(t, m.mpicc, "chaos_mpi")
	hf := filepath.Join(dir, "hosts")
	os.WriteFile(hf, []byte(m.hostfile), 0o644)
	runJob := func(tag string) string {
		argv := append([]string{wrapScript(t), "--shared-fs", "--workdir", filepath.Join(dir, tag), "--map", mapPath}, m.argv(bin, hf, "2")...)
		job := mpiJob{Host: "node-1.site1", Argv: argv, Dir: dir, Timeout: 90 * time.Second, Done: "chaos_mpi ok"}
		return job.run(t, l)
	}
	out := runJob("service")
	t.Logf("through the service gateways:\n%s", lastLines(out, 6))
	for _, site := range l.Sites() {
		if !strings.Contains(out, "site "+site+": using its running gateway") {
			t.Errorf("the run did not use site %s's running gateway:\n%s", site, out)
		}
	}
	if strings.Contains(out, "starting one") || strings.Contains(out, "MPI5K-GATEWAY") {
		t.Errorf("the run started gateways of its own:\n%s", out)
	}
	// The service gateways carried the job's streams.
	mout, err := helper(t, context.Background(), l, "node-1.site1", "get",
		"http://"+netip.AddrPortFrom(l.Addr(l.Gateway("site1")), 9105).String()+"/metrics").Output()
	if err != nil {
		t.Fatal(err)
	}
	var opened float64
	for _, line := range strings.Split(string(mout), "\n") {
		if strings.HasPrefix(line, "mpi5k_streams_opened_total{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			opened += v
		}
	}
	t.Logf("site1's service gateway opened %v streams", opened)
	if opened == 0 {
		t.Errorf("site1's service gateway opened no stream for the job")
	}

	for _, g := range gws {
		g.cmd.Process.Signal(syscall.SIGTERM)
	}
	for site, g := range gws {
		select {
		case err := <-g.exit:
			g.exit <- err
		case <-time.After(20 * time.Second):
			t.Fatalf("service gateway %s still runs", site)
		}
	}
	out = runJob("perjob")
	t.Logf("with per-job gateways from the map:\n%s", lastLines(out, 8))
	for _, site := range l.Sites() {
		if !strings.Contains(out, "site "+site+": its gateway does not answer at ready=") {
			t.Errorf("the run did not say why site %s gets a gateway of its own:\n%s", site, out)
		}
	}
	if !strings.Contains(out, "MPI5K-GATEWAY site=site1") {
		t.Errorf("no summary of the per-job gateways:\n%s", out)
	}
}
