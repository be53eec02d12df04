package wrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// startGateways starts the job's gateways and waits until all are ready.
// When a drawn port is taken on a gateway host (another job's), it stops
// them and tries again on other ports; the gateways it returns with, ready
// or not, are the caller's to stop.
func (c *Config) startGateways(ctx context.Context, j *job) error {
	for try := 1; ; try++ {
		err := c.startOnce(ctx, j)
		if err == nil {
			return nil
		}
		stopAll(j.gws, c.Stderr)
		if !errors.Is(err, errPortTaken) || j.userPorts == c.ports() || try == portTries {
			return err
		}
		// Another job (or program) holds a port on a gateway host.
		fmt.Fprintf(c.Stderr, "mpi5k: a gateway port of %d, %d, %d is in use on a gateway host; drawing others\n",
			c.LANPort, c.WANPort, c.MetricsPort)
		c.setPorts(pickPorts(j.rng, j.userPorts.lan, j.userPorts.wan, j.userPorts.metrics))
		if j.mapText, err = c.siteMapText(j); err != nil {
			return err
		}
		if err := os.WriteFile(j.mapPath, []byte(j.mapText), 0o644); err != nil {
			return err
		}
		j.gws = c.gateways(j.own, j.mapPath, j.tag, j.rng)
	}
}

// startOnce copies the map (unless shared) and the keys (unless nil),
// starts every gateway and waits until all are ready.
func (c *Config) startOnce(ctx context.Context, j *job) error {
	if !c.SharedFS {
		if err := c.distribute(ctx, j.place.mapHosts(j.own), j.mapPath, j.mapText); err != nil {
			return err
		}
	}
	if j.keys != nil {
		if err := c.placeKeys(ctx, j.own, j.keys); err != nil {
			return err
		}
		for _, g := range j.gws {
			g.argv = withKey(g.argv, j.keys.files[keyAt(g.site.Name, g.hostName())])
		}
	}
	for _, g := range j.gws {
		if err := g.start(c.WorkDir); err != nil {
			return fmt.Errorf("site %s: starting the gateway on %s: %v", g.site.Name, g.hostName(), err)
		}
	}
	return waitReady(ctx, j.gws, c.ReadyTimeout)
}

func stopAll(gws []*gateway, w io.Writer) {
	w = &serialWriter{w: w}
	var wg sync.WaitGroup
	for _, g := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); g.stop(w) }()
	}
	wg.Wait()
}

func (c *Config) ports() ports { return ports{c.LANPort, c.WANPort, c.MetricsPort} }

func (c *Config) setPorts(p ports) { c.LANPort, c.WANPort, c.MetricsPort = p.lan, p.wan, p.metrics }

// gateways are the job's own gateways, one per gateway host of each site
// of own, not started. Their /metrics is on the job's metrics port, else
// (a map's gateways, on the map's ports) on one drawn beside the site's.
func (c *Config) gateways(own []*Site, mapPath, tag string, rng *rand.Rand) []*gateway {
	var gws []*gateway
	for _, s := range own {
		port := c.MetricsPort
		if port == 0 {
			port = pickPorts(rng, s.ports.lan, s.ports.wan, 0).metrics
		}
		for i, h := range s.gatewayHosts() {
			g := &gateway{site: s, host: h, argv: c.gatewayCommand(s, i, mapPath, tag, port), metrics: h.hostPort(port), tag: tag,
				unprimed: c.StartWhen == StartLinks}
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
func (c *Config) gatewayCommand(s *Site, i int, mapPath, tag string, metricsPort int) []string {
	h := s.gatewayHosts()[i]
	argv := append([]string(nil), c.Launcher...)
	argv = append(argv, h.Name, c.GatewayBin, "--map", mapPath, "--site", s.Name,
		"--metrics", h.hostPort(metricsPort),
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

// mapHosts are the hosts of a plan's sites, gateway hosts first.
func mapHosts(sites []*Site) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range sites {
		for _, h := range append(s.gatewayHosts(), s.Hosts...) {
			if !seen[h.Name] {
				seen[h.Name] = true
				out = append(out, h.Name)
			}
		}
	}
	return out
}

// distribute copies the map to hosts, in parallel, through the launcher
// (the wrapper cannot assume a file system shared across sites).
func (c *Config) distribute(ctx context.Context, hosts []string, mapPath, text string) error {
	return c.onHosts(ctx, hosts, func(ctx context.Context, h string) error {
		argv := c.copyCommand(h, mapPath)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdin = strings.NewReader(text)
		cmd.WaitDelay = pipeDelay
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("copying the site map to %s: %v: %s", h, err, bytes.TrimSpace(out))
		}
		return nil
	})
}

// serialWriter serializes the writes of goroutines that report on one
// writer (the caller's stderr).
type serialWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *serialWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
