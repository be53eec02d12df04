package wrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// Config is one wrapped run. The zero value of a field means its default
// (DefaultConfig); Run fills zero fields from it and calls Validate.
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
	// StartWhen is when the launcher starts: StartPrimed, once every WAN
	// link of the job's gateways is up and its bulk links primed, or
	// StartLinks, once the links are up (MPI_Init overlaps priming; the
	// job's first bytes join the filler). "": DefaultStartWhen.
	StartWhen   string
	WorkDir     string // where the map and logs go; must be valid on every host if SharedFS
	SharedFS    bool   // WorkDir is visible on every host: skip copying the map
	TraceDir    string // MPI5K_TRACE for the ranks
	SummaryJSON string // --summary-json: the gateway summary as JSON, written here
	DryRun      bool
	Keep        bool // keep WorkDir
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

// DefaultConfig returns the defaults of Config's settings: the process's
// output and environment, ssh, a 30 s ready timeout, GatewayOutage, the
// launcher started once the links are primed.
func DefaultConfig() Config {
	return Config{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		Launcher: []string{"ssh"}, ReadyTimeout: 30 * time.Second, Outage: GatewayOutage,
		StartWhen: DefaultStartWhen}
}

// fillDefaults gives zero fields their defaults (DefaultConfig).
func (c *Config) fillDefaults() {
	d := DefaultConfig()
	if c.Stdout == nil {
		c.Stdout = d.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = d.Stderr
	}
	if c.Getenv == nil {
		c.Getenv = d.Getenv
	}
	if len(c.Launcher) == 0 {
		c.Launcher = d.Launcher
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = d.ReadyTimeout
	}
	if c.Outage == 0 {
		c.Outage = d.Outage
	}
	if c.StartWhen == "" {
		c.StartWhen = d.StartWhen
	}
}

// When the launcher starts (Config.StartWhen).
const (
	StartPrimed      = "primed"
	StartLinks       = "links"
	DefaultStartWhen = StartPrimed
)

// Validate reports the first setting missing or out of range; zero
// fields stand for their defaults.
func (c *Config) Validate() error {
	if len(c.Argv) == 0 {
		return errors.New("no mpirun command given")
	}
	if c.StartWhen != "" && c.StartWhen != StartPrimed && c.StartWhen != StartLinks {
		return fmt.Errorf("--start-when %q: want %s or %s", c.StartWhen, StartPrimed, StartLinks)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadyTimeout", c.ReadyTimeout}, {"Outage", c.Outage}} {
		if d.v < 0 {
			return fmt.Errorf("%s %v is negative: give a positive duration, or 0 for its default", d.name, d.v)
		}
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"LANPort", c.LANPort}, {"WANPort", c.WANPort}, {"MetricsPort", c.MetricsPort}, {"NodePort", c.NodePort}} {
		if p.v < 0 || p.v > 65535 {
			return fmt.Errorf("%s %d out of range 1..65535 (0: drawn per job)", p.name, p.v)
		}
	}
	return nil
}

// exitError carries mpirun's exit status through Run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("mpirun exited with status %d", e.code) }

// Run performs a wrapped run and returns the exit status the wrapper
// should exit with (mpirun's, or 1 with err set when the wrapper failed).
// It is one path for both ways of placing the hosts: a plan made from the
// host list, or the hand-written site map of --map.
func Run(ctx context.Context, c Config) (int, error) {
	c.fillDefaults()
	if err := c.Validate(); err != nil {
		return 2, err
	}
	f, hosts, src, err := c.commandHosts()
	if err != nil {
		return 2, err
	}
	if c.MapFile == "" {
		c.MapFile = c.Getenv("MPI5K_SITE_MAP")
	}
	place := c.placeByPlan
	if c.MapFile != "" {
		place = c.placeByMap
	}
	p, err := place(ctx, hosts)
	if err != nil {
		return 2, err
	}
	if len(p.sites) == 1 {
		return c.runUnchanged(ctx, p.sites[0].Name)
	}
	fmt.Fprint(c.Stderr, p.note)
	running, own := c.runningGateways(ctx, p.sites)
	if p.keyed && len(own) > 0 && !c.DryRun {
		return 1, fmt.Errorf("--map %s lists gateway keys and site %s has no running gateway: mpi5k run holds no site's private key, so it cannot start one; start that site's service gateway (docs/operations.md)",
			c.MapFile, siteNames(own))
	}
	if err := c.checkTools(own, p.nodeDaemons); err != nil {
		return 2, err
	}
	fileDir, cleanup, err := c.makeWorkDir()
	if err != nil {
		return 1, err
	}
	defer cleanup()
	j := &job{f: f, hosts: hosts, src: src, place: p, own: own, running: running, fileDir: fileDir}
	if code, err := c.prepare(j); err != nil {
		return code, err
	}
	if c.DryRun {
		return c.printDryRun(j)
	}
	return c.run(ctx, j)
}

// commandHosts finds the launcher's flavour and the job's hosts: those its
// command line names, else the batch system's, which the command line is
// then given. The command line also gets what it needs for
// --launcher oarsh.
func (c *Config) commandHosts() (Flavour, []Host, []HostSource, error) {
	f := c.Flavour
	if f == nil {
		var err error
		if f, err = DetectFlavour(c.Argv[0]); err != nil {
			return nil, nil, nil, err
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
		return nil, nil, nil, err
	}
	hosts, src, err := HostsFromArgs(f, c.Argv)
	if err != nil || len(hosts) > 0 {
		return f, hosts, src, err
	}
	hosts, bsrc, err := HostsFromBatch(c.Getenv)
	if err != nil {
		return nil, nil, nil, err
	}
	if bsrc == nil {
		return nil, nil, nil, errNoHosts()
	}
	if argv, fsrc := WithBatchHostfile(f, c.Argv, *bsrc); fsrc != nil {
		fmt.Fprintf(c.Stderr, "mpi5k: %s names the hosts: passing it to %s as %s %s (without it every rank would run on this host)\n",
			bsrc.Option, filepath.Base(c.Argv[0]), fsrc[0].Option, bsrc.File)
		c.Argv, src = argv, fsrc
	}
	return f, hosts, src, nil
}

// runUnchanged runs the command as it is: every host is in one site.
func (c *Config) runUnchanged(ctx context.Context, site string) (int, error) {
	fmt.Fprintf(c.Stderr, "mpi5k: every host is in site %s: running mpirun unchanged, without gateways\n", site)
	if c.DryRun {
		fmt.Fprintln(c.Stdout, shellJoin(c.Argv))
		return 0, nil
	}
	return runMPI(ctx, *c, c.Argv, nil, nil)
}

// checkTools finds the commands and files the run needs here (a dry run
// needs none): the launcher through which it starts gateways and copies
// the map, the MPI launcher, the binaries.
func (c *Config) checkTools(own []*Site, nodeDaemons bool) error {
	if c.DryRun {
		return nil
	}
	var cmds, files []string
	if len(own) > 0 || !c.SharedFS {
		cmds = append(cmds, c.Launcher[0])
	}
	cmds = append(cmds, c.Argv[0])
	if len(own) > 0 {
		files = append(files, c.GatewayBin)
	}
	files = append(files, c.Preload)
	if nodeDaemons {
		files = append(files, c.NodeBin)
	}
	for _, name := range cmds {
		if _, err := lookPath(name); err != nil {
			return fmt.Errorf("%s: not found on PATH", name)
		}
	}
	for _, p := range files {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%v", err)
		}
	}
	return nil
}

// makeWorkDir creates the workdir (default ~/.mpi5k/run-PID-TIME) and
// returns where the run's files go, and what removes them. A dry run's
// go to a temporary directory: it leaves nothing behind.
func (c *Config) makeWorkDir() (fileDir string, cleanup func(), err error) {
	if c.WorkDir == "" {
		home := c.Getenv("HOME")
		if home == "" {
			home = os.TempDir()
		}
		c.WorkDir = filepath.Join(home, ".mpi5k", fmt.Sprintf("run-%d-%d", os.Getpid(), time.Now().Unix()))
	}
	if c.DryRun {
		dir, err := os.MkdirTemp("", "mpi5k-dry-run-")
		if err != nil {
			return "", nil, err
		}
		return dir, func() { os.RemoveAll(dir) }, nil
	}
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return "", nil, err
	}
	if c.Keep {
		return c.WorkDir, func() {}, nil
	}
	return c.WorkDir, func() { os.RemoveAll(c.WorkDir) }, nil
}

// job is a run once its hosts are placed: what the dry run prints and the
// run starts.
type job struct {
	f       Flavour
	hosts   []Host
	src     []HostSource
	place   *placement
	own     []*Site    // the sites whose gateways the job starts
	running []*gateway // the sites served by their running gateways
	fileDir string     // where files for the launcher go (the workdir, a dry run's own)

	rng       *rand.Rand
	userPorts ports    // the ports the user gave (0: drawn)
	keys      *jobKeys // nil: keyless
	mapPath   string   // the site map, in the workdir on every host
	mapText   string
	tag       string     // the gateways' --ready-tag
	gws       []*gateway // the job's own gateways
	nodes     []SiteHost // the hosts that run node daemons
	mpiArgv   []string   // the launcher's command line, with the injection
}

// prepare decides the job's ports, keys, site map and commands: all that
// a dry run prints. It returns the exit status for its error.
func (c *Config) prepare(j *job) (int, error) {
	j.mapPath = filepath.Join(c.WorkDir, "sites.conf")
	j.rng = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	j.userPorts = c.ports()
	if !j.place.mapPorts {
		c.setPorts(pickPorts(j.rng, j.userPorts.lan, j.userPorts.wan, j.userPorts.metrics))
	}
	if !j.place.keyed && len(j.running) == 0 && !c.Plaintext {
		// The running gateways of a job that uses some would know no
		// keys of the job's own.
		var err error
		if j.keys, err = newJobKeys(j.own); err != nil {
			return 1, err
		}
	}
	text, err := c.siteMapText(j)
	if err != nil {
		return 1, err
	}
	if !j.place.unresolved {
		if _, err := sitemap.Parse(strings.NewReader(text), "the site map built from the host list"); err != nil {
			return 1, fmt.Errorf("%v (hosts from %s)", err, hostOrigin(j.src, c.SitesFile))
		}
	}
	j.mapText = text
	if err := c.launcherCommand(j); err != nil {
		return 2, err
	}
	j.tag = fmt.Sprintf("%d-%x", os.Getpid(), j.rng.Uint64())
	j.gws = c.gateways(j.own, j.mapPath, j.tag, j.rng)
	return 0, nil
}

// launcherCommand is the user's command line with the ranks kept off the
// gateway hosts (--dedicated-gateways) and with what the ranks need in
// their environment: the preload, the map, the node daemon's address.
func (c *Config) launcherCommand(j *job) error {
	argv := c.Argv
	if c.Dedicated {
		drop := map[string]bool{}
		for _, s := range j.place.sites {
			for _, g := range s.gatewayHosts() {
				drop[g.Name] = true
			}
		}
		var err error
		if argv, err = WithoutHosts(j.f, argv, j.hosts, j.src, drop, j.fileDir); err != nil {
			return err
		}
	}
	in := Inject{Preload: c.Preload, Map: j.mapPath, Env: map[string]string{}}
	if j.place.nodeDaemons {
		var err error
		if j.nodes, err = nodeHosts(j.place.sites, c.Dedicated); err != nil {
			return err
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
	var err error
	j.mpiArgv, err = in.Command(j.f, argv, c.Getenv)
	return err
}

// siteMapText is the job's site map for the current ports, with the keys.
func (c *Config) siteMapText(j *job) (string, error) {
	services := map[string]bool{}
	for _, g := range j.running {
		services[g.site.Name] = true
	}
	text, err := j.place.siteMap(c.LANPort, c.WANPort, services)
	if err != nil {
		return "", err
	}
	if j.keys != nil {
		text += j.keys.recs
	}
	return text, nil
}

// printDryRun prints the site map and every command the run would run.
func (c *Config) printDryRun(j *job) (int, error) {
	w := c.Stdout
	if j.place.keyed {
		fmt.Fprintf(w, "# the map lists gateway keys: each site needs its running service gateway (mpi5k run starts none for a keyed map)\n")
	}
	fmt.Fprintf(w, "# flavour: %s\n", j.f)
	if j.place.unresolved {
		fmt.Fprintf(w, "# a dry run resolves no host names: each name stands for its address\n")
	}
	if c.MapFile != "" {
		fmt.Fprintf(w, "# site map %s (from --map %s):\n%s", j.mapPath, c.MapFile, j.mapText)
	} else {
		fmt.Fprintf(w, "# site map %s:\n%s", j.mapPath, j.mapText)
	}
	if err := printFiles(w, j.fileDir, c.WorkDir); err != nil {
		return 1, err
	}
	if !c.SharedFS {
		fmt.Fprintf(w, "# copy the map to every host:\n")
		for _, h := range j.place.mapHosts(j.own) {
			fmt.Fprintln(w, shellJoin(c.copyCommand(h, j.mapPath)))
		}
	}
	if j.keys != nil {
		c.printKeyPlacing(j.own)
	}
	if nds := c.nodeDaemons(j.place.sites, j.nodes, j.mapPath); len(nds) > 0 {
		fmt.Fprintf(w, "# node daemons (--lan-transport mx), after the gateways:\n")
		for _, n := range nds {
			fmt.Fprintln(w, shellJoin(n.argv))
		}
	}
	if c.MapFile != "" {
		fmt.Fprintf(w, "# gateways (a site whose map record has ready= uses its running gateway when /ready answers):\n")
	} else {
		fmt.Fprintf(w, "# gateways:\n")
	}
	for _, g := range j.gws {
		argv := g.argv
		if j.keys != nil {
			argv = withKey(argv, keyDryRun)
		}
		fmt.Fprintln(w, shellJoin(argv))
	}
	c.printTrace(w, traceHosts(j.hosts))
	fmt.Fprintf(w, "# mpirun:\n%s\n", strings.ReplaceAll(shellJoin(j.mpiArgv), j.fileDir, c.WorkDir))
	return 0, nil
}

// run starts the job's gateways and node daemons, runs the launcher while
// watching the gateways, and stops everything again.
func (c *Config) run(ctx context.Context, j *job) (int, error) {
	if err := os.WriteFile(j.mapPath, []byte(j.mapText), 0o644); err != nil {
		return 1, err
	}
	if c.TraceDir != "" {
		if err := c.prepareTrace(ctx, traceHosts(j.hosts)); err != nil {
			return 1, err
		}
	}
	if j.keys != nil {
		defer c.removeKeys(j.own, j.keys) // after the gateways stopped (deferred later)
	}
	if err := c.startGateways(ctx, j); err != nil {
		return 1, err
	}
	defer stopAll(j.gws, c.Stderr)
	if nds := c.nodeDaemons(j.place.sites, j.nodes, j.mapPath); len(nds) > 0 {
		err := c.startNodes(ctx, nds)
		defer stopAll(nds, c.Stderr)
		if err != nil {
			return 1, err
		}
	}
	start := snapshot(j.gws)
	wctx, unwatch := context.WithCancel(ctx)
	// Only the job's own gateways are watched and summed up: a service
	// gateway's /ready and counters cover every site and job it serves.
	live := newLiveness(j.gws)
	live.resumable = c.LANTransport == "mx"
	code, err := runMPI(ctx, *c, j.mpiArgv, watch(wctx, j.gws, c.Outage), live)
	unwatch()
	if c.TraceDir != "" {
		c.collectTrace(ctx, traceHosts(j.hosts))
	}
	c.report(collect(j.gws, start, live), code)
	if len(j.running) > 0 {
		fmt.Fprintf(c.Stderr, "mpi5k: through the running gateways of site %s (their /metrics: %s)\n", siteNames(sitesOf(j.running)), metricsURLs(j.running))
	}
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
