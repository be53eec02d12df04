package wrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// Config is one wrapped run.
type Config struct {
	Argv                          []string // the user's mpirun command, unmodified
	Flavour                       Flavour  // Unknown = detect from Argv[0]
	SitesFile                     string   // --sites FILE; "" = Grid'5000 naming
	Gateways                      map[string]string
	Dedicated                     bool
	Launcher                      []string // how to run a command on a host: ssh by default
	GatewayBin                    string   // mpi5k-gateway, same path on every gateway host
	Preload                       string   // libmpi5k.so, same path on every host
	GatewayArgs                   []string // --lan-cc, --wan-cc, --wan-conns, --chunk, --window ... passed on
	LANPort, WANPort, MetricsPort int
	ReadyTimeout                  time.Duration
	WorkDir                       string // where the map and logs go; must be valid on every host if SharedFS
	SharedFS                      bool   // WorkDir is visible on every host: skip copying the map
	TraceDir                      string // MPI5K_TRACE for the ranks
	DryRun                        bool
	Keep                          bool // keep WorkDir
	Stdout, Stderr                io.Writer
	Getenv                        func(string) string
	Resolve                       Resolver
}

func (c *Config) defaults() {
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if len(c.Launcher) == 0 {
		c.Launcher = []string{"ssh"}
	}
	if c.LANPort == 0 {
		c.LANPort = 5000
	}
	if c.WANPort == 0 {
		c.WANPort = 5001
	}
	if c.MetricsPort == 0 {
		c.MetricsPort = 5002
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 30 * time.Second
	}
}

// exitError carries mpirun's exit status through Run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("mpirun exited with status %d", e.code) }

// Run performs a wrapped run and returns the exit status the wrapper
// should exit with (mpirun's, or 1 with err set when the wrapper failed).
func Run(ctx context.Context, c Config) (int, error) {
	c.defaults()
	if len(c.Argv) == 0 {
		return 2, errors.New("no mpirun command given")
	}
	f := c.Flavour
	if f == Unknown {
		var err error
		if f, err = DetectFlavour(c.Argv[0]); err != nil {
			return 2, err
		}
	}
	hosts, src, err := HostsFromArgs(f, c.Argv)
	if err != nil {
		return 2, err
	}
	if len(hosts) == 0 {
		bh, bsrc, err := HostsFromBatch(c.Getenv)
		if err != nil {
			return 2, err
		}
		if bsrc == nil {
			return 2, fmt.Errorf("no host list: the command has no hostfile/host option and no batch system ($OAR_NODEFILE, $PBS_NODEFILE, $SLURM_JOB_NODELIST) is set")
		}
		hosts = bh
	}
	po := PlanOptions{Gateways: c.Gateways, Dedicated: c.Dedicated, Resolve: c.Resolve, EnvGateways: map[string]string{}}
	if g := c.Getenv("MPI5K_GATEWAYS"); g != "" {
		if err := ParseGateways(po.EnvGateways, g); err != nil {
			return 2, fmt.Errorf("$MPI5K_GATEWAYS: %v", err)
		}
	}
	if c.SitesFile != "" {
		if po.Rules, err = ReadSiteRules(c.SitesFile); err != nil {
			return 2, err
		}
	}
	plan, err := MakePlan(ctx, hosts, po)
	if err != nil {
		return 2, err
	}
	if len(plan.Sites) == 1 {
		fmt.Fprintf(c.Stderr, "mpi5k: every host is in site %s: running mpirun unchanged, without gateways\n", plan.Sites[0].Name)
		if c.DryRun {
			fmt.Fprintln(c.Stdout, shellJoin(c.Argv))
			return 0, nil
		}
		return runMPI(ctx, c, c.Argv)
	}
	fmt.Fprint(c.Stderr, placementNote(plan, c.Dedicated))
	for _, name := range []string{c.Launcher[0], c.Argv[0]} {
		if _, err := lookPath(name); err != nil && !c.DryRun {
			return 2, fmt.Errorf("%s: not found on PATH", name)
		}
	}
	for _, p := range []string{c.GatewayBin, c.Preload} {
		if _, err := os.Stat(p); err != nil && !c.DryRun {
			return 2, fmt.Errorf("%v", err)
		}
	}

	if c.WorkDir == "" {
		home := c.Getenv("HOME")
		if home == "" {
			home = os.TempDir()
		}
		c.WorkDir = filepath.Join(home, ".mpi5k", fmt.Sprintf("run-%d-%d", os.Getpid(), time.Now().Unix()))
	}
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return 1, err
	}
	if !c.Keep && !c.DryRun {
		defer os.RemoveAll(c.WorkDir)
	}
	mapPath := filepath.Join(c.WorkDir, "sites.conf")
	mapText := plan.MapText(c.LANPort, c.WANPort)
	if _, err := sitemap.Parse(strings.NewReader(mapText), mapPath); err != nil {
		return 1, fmt.Errorf("the site map built from the host list is invalid: %v", err)
	}
	if err := os.WriteFile(mapPath, []byte(mapText), 0o644); err != nil {
		return 1, err
	}

	argv := c.Argv
	if c.Dedicated {
		drop := map[string]bool{}
		for _, s := range plan.Sites {
			drop[s.Gateway.Name] = true
		}
		if argv, err = WithoutHosts(f, argv, hosts, src, drop, c.WorkDir); err != nil {
			return 2, err
		}
	}
	in := Inject{Preload: c.Preload, Map: mapPath, Env: map[string]string{}}
	if c.TraceDir != "" {
		in.Env["MPI5K_TRACE"] = c.TraceDir
	}
	for _, k := range []string{"MPI5K_LOG", "MPI5K_FALLBACK", "MPI5K_TRACE_SAMPLE"} {
		if v := c.Getenv(k); v != "" {
			in.Env[k] = v
		}
	}
	mpiArgv, err := in.Command(f, argv, c.Getenv)
	if err != nil {
		return 2, err
	}
	gws := make([]*gateway, len(plan.Sites))
	for i, s := range plan.Sites {
		gws[i] = &gateway{site: s, argv: c.gatewayCommand(s, mapPath),
			metrics: netip.AddrPortFrom(s.Gateway.Addrs[0], uint16(c.MetricsPort))}
	}

	if c.DryRun {
		fmt.Fprintf(c.Stdout, "# flavour: %s\n# site map %s:\n%s", f, mapPath, mapText)
		if !c.SharedFS {
			fmt.Fprintf(c.Stdout, "# copy the map to every host:\n")
			for _, h := range mapHosts(plan) {
				fmt.Fprintln(c.Stdout, shellJoin(c.copyCommand(h, mapPath)))
			}
		}
		fmt.Fprintf(c.Stdout, "# gateways:\n")
		for _, g := range gws {
			fmt.Fprintln(c.Stdout, shellJoin(g.argv))
		}
		fmt.Fprintf(c.Stdout, "# mpirun:\n%s\n", shellJoin(mpiArgv))
		return 0, nil
	}

	if !c.SharedFS {
		if err := c.distribute(ctx, plan, mapPath, mapText); err != nil {
			return 1, err
		}
	}
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Add(1)
			go func() { defer wg.Done(); g.stop() }()
		}
		wg.Wait()
	}()
	for _, g := range gws {
		if err := g.start(c.WorkDir); err != nil {
			return 1, fmt.Errorf("site %s: starting the gateway on %s: %v", g.site.Name, g.site.Gateway.Name, err)
		}
	}
	if err := waitReady(ctx, gws, c.ReadyTimeout); err != nil {
		return 1, err
	}
	start := snapshot(gws)
	code, err := runMPI(ctx, c, mpiArgv)
	if s := summary(gws, start); s != "" {
		fmt.Fprint(c.Stderr, s)
	}
	return code, err
}

func (c *Config) gatewayCommand(s *Site, mapPath string) []string {
	argv := append([]string(nil), c.Launcher...)
	argv = append(argv, s.Gateway.Name, c.GatewayBin, "--map", mapPath, "--site", s.Name,
		"--metrics", netip.AddrPortFrom(s.Gateway.Addrs[0], uint16(c.MetricsPort)).String(),
		"--exit-on-stdin-eof")
	return append(argv, c.GatewayArgs...)
}

func (c *Config) copyCommand(host, mapPath string) []string {
	argv := append([]string(nil), c.Launcher...)
	dir := filepath.Dir(mapPath)
	return append(argv, host, fmt.Sprintf("mkdir -p %s && cat > %s", shellQuote(dir), shellQuote(mapPath)))
}

func mapHosts(p *Plan) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range p.Sites {
		for _, h := range append([]SiteHost{s.Gateway}, s.Hosts...) {
			if !seen[h.Name] {
				seen[h.Name] = true
				out = append(out, h.Name)
			}
		}
	}
	return out
}

// distribute copies the map to every host, in parallel, through the
// launcher (the wrapper cannot assume a file system shared across sites).
func (c *Config) distribute(ctx context.Context, p *Plan, mapPath, text string) error {
	hosts := mapHosts(p)
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			argv := c.copyCommand(h, mapPath)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Stdin = strings.NewReader(text)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("copying the site map to %s: %v: %s", h, err, bytes.TrimSpace(out))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// gateway is one gateway started through the launcher.
type gateway struct {
	site    *Site
	argv    []string
	metrics netip.AddrPort
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	logPath string
	done    chan struct{}
	waitErr error
	last    string // last /metrics scrape
}

func (g *gateway) start(dir string) error {
	g.logPath = filepath.Join(dir, "gateway-"+g.site.Name+".log")
	log, err := os.Create(g.logPath)
	if err != nil {
		return err
	}
	g.cmd = exec.Command(g.argv[0], g.argv[1:]...)
	g.cmd.Stdout, g.cmd.Stderr = log, log
	// Own session, as a daemon has: a Ctrl-C at the terminal reaches mpirun
	// while the gateways stay up until the summary is read and stop in
	// order; and under autogroup scheduling (Linux's default) a gateway
	// that shares cores with ranks weighs as a job of its own, not as one
	// more thread of the MPI job's session beside its spinning ranks. (In
	// the lab, whose hosts share the machine's cores, BT under competing
	// traffic took 1.57x direct's time with the gateways in mpirun's
	// session and 1.09x in their own.) The session is also the process
	// group stop signals.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if g.stdin, err = g.cmd.StdinPipe(); err != nil {
		log.Close()
		return err
	}
	if err := g.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	log.Close()
	g.done = make(chan struct{})
	go func() { g.waitErr = g.cmd.Wait(); close(g.done) }()
	return nil
}

// stop closes the gateway's stdin (the gateway runs with
// --exit-on-stdin-eof, which survives ssh), then signals the launcher's
// session (its process group), and kills it if it lingers.
func (g *gateway) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	g.stdin.Close()
	select {
	case <-g.done:
		return
	case <-time.After(2 * time.Second):
	}
	syscall.Kill(-g.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(3 * time.Second):
		syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
		<-g.done
	}
}

func (g *gateway) logTail() string {
	b, _ := os.ReadFile(g.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls every gateway's /ready until all are ready, one exits,
// or the timeout passes; errors name the site.
func waitReady(ctx context.Context, gws []*gateway, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	pending := append([]*gateway(nil), gws...)
	for len(pending) > 0 {
		var still []*gateway
		for _, g := range pending {
			select {
			case <-g.done:
				return fmt.Errorf("site %s: the gateway on %s exited before it was ready (%v):\n%s",
					g.site.Name, g.site.Gateway.Name, g.waitErr, g.logTail())
			default:
			}
			resp, err := client.Get("http://" + g.metrics.String() + "/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					continue
				}
			}
			still = append(still, g)
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			names := make([]string, len(pending))
			for i, g := range pending {
				names[i] = fmt.Sprintf("%s (gateway %s, %s)", g.site.Name, g.site.Gateway.Name, g.metrics)
			}
			return fmt.Errorf("gateways not ready after %v: site %s", timeout, strings.Join(names, ", site "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// runMPI runs the launcher with the terminal, forwards SIGINT, SIGTERM and
// SIGHUP to it, and returns its exit status.
func runMPI(ctx context.Context, c Config, argv []string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.Stdout, c.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("starting %s: %v", argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case err := <-done:
			if err == nil {
				return 0, nil
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal()), nil
				}
				return ee.ExitCode(), nil
			}
			return 1, err
		}
	}
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == '=' || r == ':' || r == ',' ||
			(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
