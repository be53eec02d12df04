package wrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// With --lan-transport mx the gateways speak MX on the site LAN, and every
// rank host runs a node daemon (`mpi5k node`, docs/architecture.md) that
// carries its ranks' connections to the gateway; the ranks' shims reach it
// on loopback (MPI5K_NODE). The daemons are started like the gateways,
// through the launcher with --exit-on-stdin-eof, once the gateways are
// ready, and stopped with them.

// nodeReady is the line a node daemon logs once it serves.
const nodeReady = "node daemon ready"

// nodeHosts are the hosts that run ranks. A gateway host among them is
// refused: its gateway's MX engine and a node daemon's would share one
// interface and MAC address, and receive each other's frames.
func nodeHosts(sites []*Site, dedicated bool) ([]SiteHost, error) {
	var out []SiteHost
	for _, s := range sites {
		for _, h := range s.Hosts {
			if s.isGateway(h.Name) {
				if dedicated {
					continue
				}
				return nil, fmt.Errorf("--lan-transport mx: host %s runs site %s's gateway and ranks, which MX cannot share (one MAC address); pass --dedicated-gateways or name a gateway host outside the job with --gateway",
					h.Name, s.Name)
			}
			out = append(out, h)
		}
	}
	return out, nil
}

// nodeDaemons are the node daemons of the job, not started: each is a
// gateway-like process of its host's site.
func (c *Config) nodeDaemons(all []*Site, hosts []SiteHost, mapPath string) []*gateway {
	sites := map[string]*Site{}
	for _, s := range all {
		sites[s.Name] = s
	}
	var out []*gateway
	for _, h := range hosts {
		argv := append([]string(nil), c.Launcher...)
		argv = append(argv, h.Name, c.NodeBin, "node", "--map", mapPath, "--site", h.Site,
			"--lan-if", c.LANIf, "--listen", c.nodeListen(), "--exit-on-stdin-eof")
		out = append(out, &gateway{site: sites[h.Site], argv: argv, logName: "node-" + h.Name})
	}
	return out
}

// nodeListen is the daemons' loopback address, the ranks' MPI5K_NODE.
func (c *Config) nodeListen() string { return fmt.Sprintf("127.0.0.1:%d", c.NodePort) }

// startNodes starts every node daemon and waits until each logged that it
// serves, one exited, or the ready timeout passed; errors name the host.
func (c *Config) startNodes(ctx context.Context, nds []*gateway) error {
	for _, n := range nds {
		if err := n.start(c.WorkDir); err != nil {
			return fmt.Errorf("starting the node daemon: %s: %v", n.argv[len(c.Launcher)], err)
		}
	}
	deadline := time.Now().Add(c.ReadyTimeout)
	for _, n := range nds {
		host := n.argv[len(c.Launcher)]
		for {
			if b, _ := os.ReadFile(n.logPath); strings.Contains(string(b), nodeReady) {
				break
			}
			select {
			case <-n.done:
				return fmt.Errorf("node daemon on %s exited: %v\n%s", host, n.waitErr, indent(n.logTail()))
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node daemon on %s not ready after %v (log %s)\n%s", host, c.ReadyTimeout,
					filepath.Base(n.logPath), indent(n.logTail()))
			}
		}
	}
	return nil
}
