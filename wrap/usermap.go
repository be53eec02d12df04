package wrap

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// A site map written by hand (--map FILE, docs/sitemap-format.md) is the
// map of a site that runs gateways as a service, or of hosts whose names
// say nothing of their site: it gives each site's gateway listeners
// (lan= and wan= may be different addresses) and its nets and hosts. The
// run uses a site's running gateway when the map names its ready=
// listener and /ready answers there; for the other sites it starts a
// per-job gateway on the map's listeners, on the host whose address they
// are.

// serviceProbe bounds the /ready question to a service gateway.
const serviceProbe = 2 * time.Second

// mapSites assigns every host to a site of m: by host record, else by the
// addresses it resolves to. Sites come back in id order.
func mapSites(ctx context.Context, m *sitemap.Map, path string, hosts []Host, resolve Resolver, dry bool) ([]*sitemap.Site, map[string][]Host, error) {
	bySite := map[string][]Host{}
	for _, h := range hosts {
		if mh, ok := m.Host(h.Name); ok {
			bySite[mh.Site] = append(bySite[mh.Site], h)
			continue
		}
		addrs, err := resolve(ctx, h.Name)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot resolve host %s: %v", h.Name, err)
		}
		site := ""
		for _, a := range addrs {
			if s, ok := m.Lookup(a); ok {
				site = s.Name
				break
			}
		}
		switch {
		case site != "":
			bySite[site] = append(bySite[site], h)
		case len(addrs) == 0 && dry:
			return nil, nil, fmt.Errorf("host %s is in no host record of --map %s, and a dry run resolves no names to match its nets: add `host <site> %s <addr>` to see its plan", h.Name, path, h.Name)
		case len(addrs) == 0:
			return nil, nil, fmt.Errorf("cannot resolve host %s: no address", h.Name)
		default:
			return nil, nil, fmt.Errorf("host %s (%s) is in no site of --map %s: add a `net <site> <cidr>` covering it or a `host <site> %s %s` record (docs/sitemap-format.md)",
				h.Name, addrs[0], path, h.Name, addrs[0])
		}
	}
	var sites []*sitemap.Site
	for _, s := range m.Sites() {
		if len(bySite[s.Name]) > 0 {
			sites = append(sites, s)
		}
	}
	return sites, bySite, nil
}

// gatewayHost is where a site's per-job gateway runs: the host record that
// holds its lan= address, else that address itself.
func gatewayHost(s *sitemap.Site) string {
	for _, h := range s.Hosts {
		for _, a := range h.Addrs {
			if a == s.LAN.Addr() {
				return h.Name
			}
		}
	}
	return s.LAN.Addr().String()
}

// runWithMap is Run for --map FILE.
func (c *Config) runWithMap(ctx context.Context, f Flavour, hosts []Host) (int, error) {
	if c.SitesFile != "" {
		return 2, errors.New("--map and --sites both say which site a host is in: give one (--map holds the same as --sites, and the gateways)")
	}
	if c.Dedicated || len(c.Gateways) > 0 {
		return 2, errors.New("--map places each site's gateway at its lan= address: leave out --dedicated-gateways and --gateway")
	}
	m, err := sitemap.Load(c.MapFile)
	if err != nil {
		return 2, fmt.Errorf("--map: %v", err)
	}
	resolve := c.Resolve
	if resolve == nil {
		resolve = DefaultResolver
	}
	if c.DryRun {
		resolve = LiteralResolver
	}
	sites, bySite, err := mapSites(ctx, m, c.MapFile, hosts, resolve, c.DryRun)
	if err != nil {
		return 2, err
	}
	if len(sites) == 1 {
		fmt.Fprintf(c.Stderr, "mpi5k: every host is in site %s: running mpirun unchanged, without gateways\n", sites[0].Name)
		if c.DryRun {
			fmt.Fprintln(c.Stdout, shellJoin(c.Argv))
			return 0, nil
		}
		return runMPI(ctx, *c, c.Argv, nil, nil)
	}

	// Which sites have a gateway running already.
	client := httpClient(serviceProbe)
	var running, own []*gateway
	var names []string
	for _, s := range sites {
		names = append(names, s.Name)
	}
	for _, s := range sites {
		ws := &Site{Name: s.Name, ID: s.ID, Gateway: SiteHost{Host: Host{Name: gatewayHost(s)}, Site: s.Name, Addrs: []netip.Addr{s.LAN.Addr()}}}
		for _, h := range bySite[s.Name] {
			ws.Hosts = append(ws.Hosts, SiteHost{Host: h, Site: s.Name})
		}
		g := &gateway{site: ws, sites: strings.Join(names, ",")}
		if s.Ready.IsValid() && !c.DryRun {
			g.metrics = s.Ready.String()
			err := g.probe(ctx, client)
			if err == nil {
				fmt.Fprintf(c.Stderr, "mpi5k: site %s: using its running gateway (ready at %s)\n", s.Name, s.Ready)
				running = append(running, g)
				continue
			}
			fmt.Fprintf(c.Stderr, "mpi5k: site %s: its gateway does not answer at ready=%s (%v): starting one for this job on %s\n",
				s.Name, s.Ready, err, ws.Gateway.Name)
		}
		own = append(own, g)
	}

	if c.WorkDir == "" {
		home := c.Getenv("HOME")
		if home == "" {
			home = os.TempDir()
		}
		c.WorkDir = filepath.Join(home, ".mpi5k", fmt.Sprintf("run-%d-%d", os.Getpid(), time.Now().Unix()))
	}
	mapPath := filepath.Join(c.WorkDir, "sites.conf")
	services := map[string]bool{}
	for _, g := range running {
		services[g.site.Name] = true
	}
	jm, err := jobMap(m, sites, services)
	if err != nil {
		return 1, fmt.Errorf("--map %s: %v", c.MapFile, err)
	}
	mapText := "# mpi5k site map: the job's sites of " + c.MapFile + "\n" + jm.String()
	// Keys: the job's own gateways get fresh ones when it runs no other
	// (keys.go); a keyed map's sites need their service gateways, whose
	// private keys mpi5k run does not hold.
	var ownSites []*Site
	for _, g := range own {
		ownSites = append(ownSites, g.site)
	}
	var keys *jobKeys
	switch {
	case m.HasKeys() && len(own) > 0 && !c.DryRun:
		return 1, fmt.Errorf("--map %s lists gateway keys and site %s has no running gateway: mpi5k run holds no site's private key, so it cannot start one; start that site's service gateway (docs/operations.md)",
			c.MapFile, siteNames(own))
	case m.HasKeys() && c.DryRun:
		fmt.Fprintf(c.Stdout, "# the map lists gateway keys: each site needs its running service gateway (mpi5k run starts none for a keyed map)\n")
	case !m.HasKeys() && len(running) == 0 && !c.Plaintext:
		if keys, err = newJobKeys(ownSites); err != nil {
			return 1, err
		}
		mapText += keys.recs
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	tag := fmt.Sprintf("%d-%x", os.Getpid(), rng.Uint64())
	for _, g := range own {
		s, _ := m.Site(g.site.Name)
		port := c.MetricsPort
		if port == 0 {
			port = pickPorts(rng, int(s.LAN.Port()), int(s.WAN.Port()), 0).metrics
		}
		g.metrics = g.site.Gateway.hostPort(port)
		g.tag, g.sites = tag, ""
		argv := append([]string(nil), c.Launcher...)
		argv = append(argv, g.site.Gateway.Name, c.GatewayBin, "--map", mapPath, "--site", s.Name,
			"--metrics", g.metrics, "--exit-on-stdin-eof", "--ready-tag", tag)
		g.argv = append(argv, c.GatewayArgs...)
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
	mpiArgv, err := in.Command(f, c.Argv, c.Getenv)
	if err != nil {
		return 2, err
	}
	var copyTo []string
	seen := map[string]bool{}
	for _, h := range hosts {
		if !seen[h.Name] {
			seen[h.Name] = true
			copyTo = append(copyTo, h.Name)
		}
	}
	for _, g := range own {
		if !seen[g.site.Gateway.Name] {
			seen[g.site.Gateway.Name] = true
			copyTo = append(copyTo, g.site.Gateway.Name)
		}
	}
	sort.Strings(copyTo)

	if c.DryRun {
		fmt.Fprintf(c.Stdout, "# flavour: %s\n# site map %s (from --map %s):\n%s", f, mapPath, c.MapFile, mapText)
		if !c.SharedFS {
			fmt.Fprintf(c.Stdout, "# copy the map to every host:\n")
			for _, h := range copyTo {
				fmt.Fprintln(c.Stdout, shellJoin(c.copyCommand(h, mapPath)))
			}
		}
		if keys != nil {
			c.printKeyPlacing(ownSites)
		}
		fmt.Fprintf(c.Stdout, "# gateways (a site whose map record has ready= uses its running gateway when /ready answers):\n")
		for _, g := range own {
			argv := g.argv
			if keys != nil {
				argv = withKey(argv, keyDryRun)
			}
			fmt.Fprintln(c.Stdout, shellJoin(argv))
		}
		c.printTrace(c.Stdout, traceHosts(hosts))
		fmt.Fprintf(c.Stdout, "# mpirun:\n%s\n", shellJoin(mpiArgv))
		return 0, nil
	}
	need := []string{c.Argv[0]}
	if len(own) > 0 || !c.SharedFS {
		need = append(need, c.Launcher[0])
	}
	for _, name := range need {
		if _, err := lookPath(name); err != nil {
			return 2, fmt.Errorf("%s: not found on PATH", name)
		}
	}
	files := []string{c.Preload}
	if len(own) > 0 {
		files = append(files, c.GatewayBin)
	}
	for _, p := range files {
		if _, err := os.Stat(p); err != nil {
			return 2, fmt.Errorf("%v", err)
		}
	}
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return 1, err
	}
	if !c.Keep {
		defer os.RemoveAll(c.WorkDir)
	}
	if err := os.WriteFile(mapPath, []byte(mapText), 0o644); err != nil {
		return 1, err
	}
	if !c.SharedFS {
		if err := c.copyMap(ctx, copyTo, mapPath, mapText); err != nil {
			return 1, err
		}
	}
	if keys != nil {
		defer c.removeKeys(ownSites, keys) // after the gateways stopped (deferred later)
		if err := c.placeKeys(ctx, ownSites, keys); err != nil {
			return 1, err
		}
		for _, g := range own {
			g.argv = withKey(g.argv, keys.files[keyAt(g.site.Name, g.hostName())])
		}
	}
	if c.TraceDir != "" {
		if err := c.prepareTrace(ctx, traceHosts(hosts)); err != nil {
			return 1, err
		}
	}
	defer stopAll(own, c.Stderr)
	for _, g := range own {
		if err := g.start(c.WorkDir); err != nil {
			return 1, fmt.Errorf("site %s: starting the gateway on %s: %v", g.site.Name, g.site.Gateway.Name, err)
		}
	}
	if err := waitReady(ctx, own, c.ReadyTimeout); err != nil {
		return 1, err
	}
	start := snapshot(own)
	wctx, unwatch := context.WithCancel(ctx)
	// Only the job's own gateways are watched and summed up: a service
	// gateway's /ready and counters cover every site and job it serves.
	live := newLiveness(own)
	live.resumable = c.LANTransport == "mx"
	code, err := runMPI(ctx, *c, mpiArgv, watch(wctx, own, c.Outage), live)
	unwatch()
	if c.TraceDir != "" {
		c.collectTrace(ctx, traceHosts(hosts))
	}
	c.report(collect(own, start, live), code)
	if len(running) > 0 {
		fmt.Fprintf(c.Stderr, "mpi5k: through the running gateways of site %s (their /metrics: %s)\n", siteNames(running), metricsURLs(running))
	}
	return code, err
}

func siteNames(gws []*gateway) string {
	var names []string
	for _, g := range gws {
		names = append(names, g.site.Name)
	}
	return strings.Join(names, ", site ")
}

func metricsURLs(gws []*gateway) string {
	var us []string
	for _, g := range gws {
		us = append(us, "http://"+g.metrics+"/metrics")
	}
	return strings.Join(us, " ")
}

// copyMap copies the map to hosts through the launcher, in parallel.
func (c *Config) copyMap(ctx context.Context, hosts []string, mapPath, text string) error {
	p := &Plan{}
	for _, h := range hosts {
		p.Sites = append(p.Sites, &Site{Gateway: SiteHost{Host: Host{Name: h}}})
	}
	return c.distribute(ctx, p, mapPath, text)
}

// jobMap is m with the job's sites only: a per-job gateway is ready once
// its links to every site of its map are up, and a site the job does not
// use may run no gateway at all. A site's further gateway hosts (gateway
// records) stay only for services, the sites whose gateways run already:
// the job's ranks then spread over them, and learn their addresses as
// gateways'. For the others the job starts one gateway, the site
// record's, which the job's own gateways alone must be able to reach.
func jobMap(m *sitemap.Map, sites []*sitemap.Site, services map[string]bool) (*sitemap.Map, error) {
	b := sitemap.NewBuilder()
	for _, s := range sites {
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
		if services[s.Name] {
			for _, g := range s.Gateways[1:] {
				b.AddGateway(s.Name, g.LAN, g.WAN)
			}
		}
		for _, n := range s.Nets {
			b.AddNet(s.Name, n)
		}
		for _, h := range s.Hosts {
			b.AddHost(s.Name, h.Name, h.Addrs...)
		}
	}
	return b.Build()
}
