package wrap

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// A placement is where the job's hosts and gateways are: a plan made from
// the host names, --sites and --gateway (placeByPlan), or a site map
// written by hand (placeByMap, usermap.go). The run is the same for both
// from there on.
type placement struct {
	sites []*Site // the job's sites, each with its hosts and gateway hosts
	// siteMap renders the job's site map, without key records, for
	// gateways on ports lan and wan; services are the sites served by
	// their running gateways.
	siteMap func(lan, wan int, services map[string]bool) (string, error)
	// mapHosts are the hosts the map is copied to (without --shared-fs)
	// when the job starts the gateways of own.
	mapHosts func(own []*Site) []string

	note        string // said on stderr once the job has two sites
	keyed       bool   // the map lists the gateways' keys: the job holds no private key, makes none
	mapPorts    bool   // the map gives the gateways' LAN and WAN ports: none is drawn
	unresolved  bool   // a dry run's plan: host names stand for their addresses
	nodeDaemons bool   // --lan-transport mx: node daemons on the rank hosts
}

// placeByPlan assigns the hosts to sites by their names or --sites, and
// picks each site's gateway hosts (--gateway, $MPI5K_GATEWAYS, else the
// last host of the site).
func (c *Config) placeByPlan(ctx context.Context, hosts []Host) (*placement, error) {
	po := PlanOptions{Gateways: c.Gateways, Dedicated: c.Dedicated, Resolve: c.Resolve, EnvGateways: map[string]string{}}
	if c.DryRun && po.Resolve == nil {
		// A dry run shows what would run without asking DNS: host names
		// stand for their addresses.
		po.Resolve, po.Unresolved = LiteralResolver, true
	}
	if g := c.Getenv("MPI5K_GATEWAYS"); g != "" {
		if err := ParseGateways(po.EnvGateways, g); err != nil {
			return nil, fmt.Errorf("$MPI5K_GATEWAYS: %v", err)
		}
	}
	if c.SitesFile != "" {
		var err error
		if po.Rules, err = ReadSiteRules(c.SitesFile); err != nil {
			return nil, fmt.Errorf("--sites: %w", err)
		}
	}
	plan, err := MakePlan(ctx, hosts, po)
	if err != nil {
		return nil, err
	}
	return &placement{
		sites:       plan.Sites,
		siteMap:     func(lan, wan int, _ map[string]bool) (string, error) { return plan.MapText(lan, wan), nil },
		mapHosts:    func([]*Site) []string { return mapHosts(plan.Sites) },
		note:        placementNote(plan, c.Dedicated),
		unresolved:  plan.Unresolved(),
		nodeDaemons: c.LANTransport == "mx",
	}, nil
}

// serviceProbe bounds the /ready question to a service gateway.
const serviceProbe = 2 * time.Second

// runningGateways asks each site whose map gives a running gateway's
// ready= whether it answers there: such a site is served by it, the
// others (own) get gateways of the job's own. A dry run asks none.
func (c *Config) runningGateways(ctx context.Context, sites []*Site) (running []*gateway, own []*Site) {
	client := httpClient(serviceProbe)
	var names []string
	for _, s := range sites {
		names = append(names, s.Name)
	}
	for _, s := range sites {
		if s.Ready.IsValid() && !c.DryRun {
			g := &gateway{site: s, metrics: s.Ready.String(), sites: strings.Join(names, ",")}
			err := g.probe(ctx, client)
			if err == nil {
				fmt.Fprintf(c.Stderr, "mpi5k: site %s: using its running gateway (ready at %s)\n", s.Name, s.Ready)
				running = append(running, g)
				continue
			}
			fmt.Fprintf(c.Stderr, "mpi5k: site %s: its gateway does not answer at ready=%s (%v): starting one for this job on %s\n",
				s.Name, s.Ready, err, s.Gateway.Name)
		}
		own = append(own, s)
	}
	return running, own
}

// placementNote is the one line mpi5k run prints when a site's gateway
// runs on a host that also runs ranks of the job: the gateway's CPU then
// comes out of theirs (every message crosses it twice). "" when every
// gateway has a host of its own or dedicated is set.
func placementNote(p *Plan, dedicated bool) string {
	if dedicated {
		return ""
	}
	var shared []string
	for _, s := range p.Sites {
		for _, h := range s.Hosts {
			if s.isGateway(h.Name) {
				shared = append(shared, s.Name+"="+h.Name)
				break
			}
		}
	}
	if len(shared) == 0 {
		return ""
	}
	return fmt.Sprintf("mpi5k: gateways share hosts with ranks (%s) and take CPU from them; "+
		"--dedicated-gateways keeps ranks off gateway hosts, --gateway SITE=HOST runs a site's gateway on a host outside the job\n",
		strings.Join(shared, ", "))
}
