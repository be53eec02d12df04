package wrap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// Config is one wrapped run.
type Config struct {
	Argv        []string // the user's mpirun command, unmodified
	Flavour     Flavour  // nil: detected from Argv[0]
	SitesFile   string   // --sites FILE; "" = Grid'5000 naming
	MapFile     string   // --map FILE ($MPI5K_SITE_MAP): a site map in the documented format
	Gateways    map[string]string
	Dedicated   bool
	Launcher    []string // how to run a command on a host: ssh by default
	GatewayBin  string   // mpi5k-gateway, same path on every gateway host
	Preload     string   // libmpi5k.so, same path on every host
	GatewayArgs []string // --lan-cc, --wan-cc, --wan-conns, --chunk, --window ... passed on
	// LANTransport "mx" (also in GatewayArgs) starts a node daemon (NodeBin
	// node) on every rank host, on interface LANIf, listening on loopback
	// port NodePort (0: the drawn LAN port).
	LANTransport, LANIf           string
	NodeBin                       string // mpi5k, same path on every rank host
	NodePort                      int
	LANPort, WANPort, MetricsPort int // 0: drawn per job (ports.go)
	ReadyTimeout                  time.Duration
	WorkDir                       string // where the map and logs go; must be valid on every host if SharedFS
	SharedFS                      bool   // WorkDir is visible on every host: skip copying the map
	TraceDir                      string // MPI5K_TRACE for the ranks
	SummaryJSON                   string // --summary-json: the gateway summary as JSON, written here
	DryRun                        bool
	Keep                          bool // keep WorkDir
	// Plaintext: the job's own gateways run keyless (no TLS), for a WAN
	// the operator already protects (docs/security.md).
	Plaintext      bool
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Resolve        Resolver

	// Outage is how long a gateway may be unreachable or without a WAN
	// link during the job before the wrapper ends it (0: GatewayOutage).
	Outage time.Duration
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
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	if c.Outage == 0 {
		c.Outage = GatewayOutage
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
	if f == nil {
		var err error
		if f, err = DetectFlavour(c.Argv[0]); err != nil {
			return 2, err
		}
	}
	if argv, added := withOarsh(f, c.Argv, c.Launcher, c.Getenv); added != "" {
		fmt.Fprintf(c.Stderr, "mpi5k: --launcher oarsh: %s starts its daemons with %s too\n", filepath.Base(c.Argv[0]), added)
		c.Argv = argv
	}
	if filepath.Base(c.Launcher[0]) == "ssh" && c.Getenv("OAR_NODEFILE") != "" {
		fmt.Fprintf(c.Stderr, "mpi5k: $OAR_NODEFILE is set (an OAR job) and --launcher is ssh: OAR jobs usually reach their nodes with oarsh (mpi5k run --launcher oarsh ...)\n")
	}
	if err := checkHostOptions(f, c.Argv); err != nil {
		return 2, err
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
		if argv, fsrc := WithBatchHostfile(f, c.Argv, *bsrc); fsrc != nil {
			fmt.Fprintf(c.Stderr, "mpi5k: %s names the hosts: passing it to %s as %s %s (without it every rank would run on this host)\n",
				bsrc.Option, filepath.Base(c.Argv[0]), fsrc[0].Option, bsrc.File)
			c.Argv, src = argv, fsrc
		}
	}
	if c.MapFile == "" {
		c.MapFile = c.Getenv("MPI5K_SITE_MAP")
	}
	if c.MapFile != "" {
		return c.runWithMap(ctx, f, hosts)
	}
	po := PlanOptions{Gateways: c.Gateways, Dedicated: c.Dedicated, Resolve: c.Resolve, EnvGateways: map[string]string{}}
	if c.DryRun && po.Resolve == nil {
		// A dry run shows what would run without asking DNS: host names
		// stand for their addresses.
		po.Resolve, po.Unresolved = LiteralResolver, true
	}
	if g := c.Getenv("MPI5K_GATEWAYS"); g != "" {
		if err := ParseGateways(po.EnvGateways, g); err != nil {
			return 2, fmt.Errorf("$MPI5K_GATEWAYS: %v", err)
		}
	}
	if c.SitesFile != "" {
		if po.Rules, err = ReadSiteRules(c.SitesFile); err != nil {
			return 2, fmt.Errorf("--sites: %w", err)
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
		return runMPI(ctx, c, c.Argv, nil, nil)
	}
	fmt.Fprint(c.Stderr, placementNote(plan, c.Dedicated))
	for _, name := range []string{c.Launcher[0], c.Argv[0]} {
		if _, err := lookPath(name); err != nil && !c.DryRun {
			return 2, fmt.Errorf("%s: not found on PATH", name)
		}
	}
	bins := []string{c.GatewayBin, c.Preload}
	if c.LANTransport == "mx" {
		bins = append(bins, c.NodeBin)
	}
	for _, p := range bins {
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
	// Files go to the workdir, a dry run's to a directory removed at
	// return: it leaves nothing behind.
	fileDir := c.WorkDir
	if c.DryRun {
		if fileDir, err = os.MkdirTemp("", "mpi5k-dry-run-"); err != nil {
			return 1, err
		}
		defer os.RemoveAll(fileDir)
	} else {
		if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
			return 1, err
		}
		if !c.Keep {
			defer os.RemoveAll(c.WorkDir)
		}
	}
	mapPath := filepath.Join(c.WorkDir, "sites.conf")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	userPorts := c.ports()
	c.setPorts(pickPorts(rng, userPorts.lan, userPorts.wan, userPorts.metrics))
	var keys *jobKeys // nil: keyless (--wan-plaintext)
	var keyRecs string
	if !c.Plaintext {
		if keys, err = newJobKeys(plan.Sites); err != nil {
			return 1, err
		}
		keyRecs = keys.recs
	}
	mapText := plan.MapText(c.LANPort, c.WANPort) + keyRecs
	if !plan.Unresolved() {
		if _, err := sitemap.Parse(strings.NewReader(mapText), "the site map built from the host list"); err != nil {
			return 1, fmt.Errorf("%v (hosts from %s)", err, hostOrigin(src, c.SitesFile))
		}
	}
	if !c.DryRun {
		if err := os.WriteFile(mapPath, []byte(mapText), 0o644); err != nil {
			return 1, err
		}
	}

	argv := c.Argv
	if c.Dedicated {
		drop := map[string]bool{}
		for _, s := range plan.Sites {
			for _, g := range s.gatewayHosts() {
				drop[g.Name] = true
			}
		}
		if argv, err = WithoutHosts(f, argv, hosts, src, drop, fileDir); err != nil {
			return 2, err
		}
	}
	in := Inject{Preload: c.Preload, Map: mapPath, Env: map[string]string{}}
	var nodes []SiteHost
	if c.LANTransport == "mx" {
		if nodes, err = nodeHosts(plan, c.Dedicated); err != nil {
			return 2, err
		}
		if c.NodePort == 0 {
			c.NodePort = c.LANPort // drawn: no other job's daemon has it
		}
		in.Env["MPI5K_NODE"] = c.nodeListen()
	}
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
	tag := fmt.Sprintf("%d-%x", os.Getpid(), rng.Uint64())
	gws := c.gateways(plan, mapPath, tag)

	if c.DryRun {
		fmt.Fprintf(c.Stdout, "# flavour: %s\n", f)
		if plan.Unresolved() {
			fmt.Fprintf(c.Stdout, "# a dry run resolves no host names: each name stands for its address\n")
		}
		fmt.Fprintf(c.Stdout, "# site map %s:\n%s", mapPath, mapText)
		if err := printFiles(c.Stdout, fileDir, c.WorkDir); err != nil {
			return 1, err
		}
		if !c.SharedFS {
			fmt.Fprintf(c.Stdout, "# copy the map to every host:\n")
			for _, h := range mapHosts(plan) {
				fmt.Fprintln(c.Stdout, shellJoin(c.copyCommand(h, mapPath)))
			}
		}
		if keys != nil {
			c.printKeyPlacing(plan.Sites)
		}
		if nds := c.nodeDaemons(plan, nodes, mapPath); len(nds) > 0 {
			fmt.Fprintf(c.Stdout, "# node daemons (--lan-transport mx), after the gateways:\n")
			for _, n := range nds {
				fmt.Fprintln(c.Stdout, shellJoin(n.argv))
			}
		}
		fmt.Fprintf(c.Stdout, "# gateways:\n")
		for _, g := range gws {
			argv := g.argv
			if keys != nil {
				argv = withKey(argv, keyDryRun)
			}
			fmt.Fprintln(c.Stdout, shellJoin(argv))
		}
		c.printTrace(c.Stdout, traceHosts(hosts))
		fmt.Fprintf(c.Stdout, "# mpirun:\n%s\n", strings.ReplaceAll(shellJoin(mpiArgv), fileDir, c.WorkDir))
		return 0, nil
	}

	if c.TraceDir != "" {
		if err := c.prepareTrace(ctx, traceHosts(hosts)); err != nil {
			return 1, err
		}
	}
	if keys != nil {
		defer c.removeKeys(plan.Sites, keys) // after the gateways stopped (deferred later)
	}
	for try := 1; ; try++ {
		err := c.startGateways(ctx, plan, gws, mapPath, mapText, keys)
		if err == nil {
			break
		}
		stopAll(gws, c.Stderr)
		if !errors.Is(err, errPortTaken) || userPorts == c.ports() || try == portTries {
			return 1, err
		}
		// Another job (or program) holds a port on a gateway host.
		fmt.Fprintf(c.Stderr, "mpi5k: a gateway port of %d, %d, %d is in use on a gateway host; drawing others\n",
			c.LANPort, c.WANPort, c.MetricsPort)
		c.setPorts(pickPorts(rng, userPorts.lan, userPorts.wan, userPorts.metrics))
		mapText = plan.MapText(c.LANPort, c.WANPort) + keyRecs
		if err := os.WriteFile(mapPath, []byte(mapText), 0o644); err != nil {
			return 1, err
		}
		gws = c.gateways(plan, mapPath, tag)
	}
	defer stopAll(gws, c.Stderr)
	if nds := c.nodeDaemons(plan, nodes, mapPath); len(nds) > 0 {
		err := c.startNodes(ctx, nds)
		defer stopAll(nds, c.Stderr)
		if err != nil {
			return 1, err
		}
	}
	start := snapshot(gws)
	wctx, unwatch := context.WithCancel(ctx)
	live := newLiveness(gws)
	live.resumable = c.LANTransport == "mx"
	code, err := runMPI(ctx, c, mpiArgv, watch(wctx, gws, c.Outage), live)
	unwatch()
	if c.TraceDir != "" {
		c.collectTrace(ctx, traceHosts(hosts))
	}
	c.report(collect(gws, start, live), code)
	return code, err
}

// report prints the gateway summary on stderr and writes it to
// --summary-json, with the launcher's status.
func (c *Config) report(sum Summary, code int) {
	sum.LauncherStatus = code
	fmt.Fprint(c.Stderr, sum.Text())
	if c.SummaryJSON == "" {
		return
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err == nil {
		err = os.WriteFile(c.SummaryJSON, append(b, '\n'), 0o644)
	}
	if err != nil {
		fmt.Fprintf(c.Stderr, "mpi5k: --summary-json %s: %v (the summary above is all there is)\n", c.SummaryJSON, err)
	}
}

// startGateways copies the map (unless shared) and the keys (unless nil),
// starts every gateway and waits until all are ready. The caller stops
// gws whatever happens.
func (c *Config) startGateways(ctx context.Context, plan *Plan, gws []*gateway, mapPath, mapText string, keys *jobKeys) error {
	if !c.SharedFS {
		if err := c.distribute(ctx, plan, mapPath, mapText); err != nil {
			return err
		}
	}
	if keys != nil {
		if err := c.placeKeys(ctx, plan.Sites, keys); err != nil {
			return err
		}
		for _, g := range gws {
			g.argv = withKey(g.argv, keys.files[keyAt(g.site.Name, g.hostName())])
		}
	}
	for _, g := range gws {
		if err := g.start(c.WorkDir); err != nil {
			return fmt.Errorf("site %s: starting the gateway on %s: %v", g.site.Name, g.hostName(), err)
		}
	}
	return waitReady(ctx, gws, c.ReadyTimeout)
}

func stopAll(gws []*gateway, w io.Writer) {
	var wg sync.WaitGroup
	for _, g := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); g.stop(w) }()
	}
	wg.Wait()
}

func (c *Config) ports() ports { return ports{c.LANPort, c.WANPort, c.MetricsPort} }

func (c *Config) setPorts(p ports) { c.LANPort, c.WANPort, c.MetricsPort = p.lan, p.wan, p.metrics }

// gateways is the per-job gateways of each site (one per gateway host),
// not started.
func (c *Config) gateways(plan *Plan, mapPath, tag string) []*gateway {
	var gws []*gateway
	for _, s := range plan.Sites {
		for i, h := range s.gatewayHosts() {
			g := &gateway{site: s, host: h, argv: c.gatewayCommand(s, i, mapPath, tag), metrics: h.hostPort(c.MetricsPort), tag: tag}
			if i > 0 {
				g.logName = fmt.Sprintf("gateway-%s-%d", s.Name, i)
			}
			gws = append(gws, g)
		}
	}
	return gws
}

// gatewayCommand starts gateway host i of site s. With several gateway
// hosts each is told its map entry (--lan, --wan): a host's addresses
// alone may not tell (a host that has several of them).
func (c *Config) gatewayCommand(s *Site, i int, mapPath, tag string) []string {
	h := s.gatewayHosts()[i]
	argv := append([]string(nil), c.Launcher...)
	argv = append(argv, h.Name, c.GatewayBin, "--map", mapPath, "--site", s.Name,
		"--metrics", h.hostPort(c.MetricsPort),
		"--exit-on-stdin-eof", "--ready-tag", tag)
	if len(s.More) > 0 {
		argv = append(argv, "--lan", h.hostPort(c.LANPort), "--wan", h.hostPort(c.WANPort))
	}
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
		for _, h := range append(s.gatewayHosts(), s.Hosts...) {
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
	ctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
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
			cmd.WaitDelay = pipeDelay
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("copying the site map to %s: %v: %s", h, err, bytes.TrimSpace(out))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// printFiles prints the files a dry run wrote into dir (rank hostfiles of
// --dedicated-gateways) under the names they would have in workdir.
func printFiles(w io.Writer, dir, workdir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "# %s:\n%s", filepath.Join(workdir, e.Name()), b)
	}
	return nil
}

// hostOrigin names where the job's hosts came from, for messages.
func hostOrigin(src []HostSource, sitesFile string) string {
	var names []string
	for _, s := range src {
		if s.File != "" {
			names = append(names, s.Option+" "+s.File)
		} else {
			names = append(names, s.Option)
		}
	}
	if len(names) == 0 {
		names = append(names, "the batch system's host list")
	}
	if sitesFile != "" {
		names = append(names, "--sites "+sitesFile)
	}
	return strings.Join(names, ", ")
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
