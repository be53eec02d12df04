// Package testbed builds and drives the emulated multi-site grid ("the
// lab"): network namespaces as hosts, one bridge per site, and a WAN whose
// delay, rate, queue, loss and jitter are emulated in user space over TUN
// devices by a daemon of bin/mpi5k. Nothing is changed in the machine's own
// network namespace or /etc: everything lives in namespaces and under
// /run/mpi5k/<lab>/.
package testbed

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/units"
)

// Config describes a lab. Zero values take the defaults noted per field
// (see Normalize).
type Config struct {
	Name   string        // lab name, default "mpi5k"; prefixes every namespace
	Sites  []string      // site names, default site1, site2
	Nodes  int           // compute hosts per site, default 2
	RTT    time.Duration // round-trip time between sites (both directions' delay)
	Jitter time.Duration // +- added to each packet's one-way delay, never reordering
	// Reorder is the fraction of WAN packets (0..1, per direction) held
	// back ReorderDelay beyond their delivery time, so later packets
	// overtake them; ReorderDelay defaults to DefaultReorderDelay.
	Reorder      float64
	ReorderDelay time.Duration
	// Seed drives every random choice of the emulator (loss, jitter,
	// reordering): the same seed and the same packets give the same
	// choices. 0 lets Up pick one from the clock and record it.
	Seed    uint64
	WANRate uint64 // bit/s per direction, 0 = unlimited
	LANRate uint64 // bit/s per LAN link (TBF on veths), 0 = unlimited
	// LANLoss is the probability that a frame crossing a site's LAN (its
	// bridge: node to gateway, node to router, router to node) is dropped,
	// for every site; SiteLANLoss overrides it per site. Applied by
	// nftables in the router namespace (the kernel here has no netem).
	LANLoss     float64
	SiteLANLoss map[string]float64
	// LANReorder is the fraction of IPv4 packets entering a site's LAN
	// from its hosts that the emulator holds back LANReorderDelay (default
	// DefaultReorderDelay), so packets sent after them arrive first;
	// SiteLANReorder overrides it per site.
	LANReorder      float64
	SiteLANReorder  map[string]float64
	LANReorderDelay time.Duration
	Loss            float64 // random loss probability per packet and direction, 0..1
	Queue           int     // WAN drop-tail queue in bytes, 0 = 1 BDP
	MTU             int     // default 1500
	// CrossMTU is the MTU of the traffic hosts' links (0: MTU), up to 9000.
	// Competing flows (lab cross) in jumbo frames cost the user-space WAN
	// emulator a sixth of the packets, so on a small machine it carries
	// them beside a job without stalling, while nodes and gateways keep
	// MTU. The sites' bridges and the emulator then take frames this size.
	CrossMTU    int
	GatewayNICs int // 1 (LAN leg only, default) or 2 (LAN + WAN leg)
	// Gateways is the number of gateway hosts per site (default 1, at most
	// MaxGateways): gw.<site>, gw2.<site>, ..., each on the site's LAN (and
	// with GatewayNICs 2 on the WAN) as the first one, and listed in the
	// site map as the site's gateways.
	Gateways int
	// HostCC is the default TCP congestion control of every lab host's
	// namespace ("" keeps the machine's). The ranks' direct connections use
	// it, so it decides what "without gateways" means: a cluster's nodes
	// usually run a loss-based TCP, this project's machines default to bbr.
	HostCC string
	// Pairs sets the WAN of site pairs apart from the lab-wide RTT,
	// Jitter, WANRate, Loss and Queue (a distance matrix, ParseMatrix);
	// pairs not listed take the lab-wide values.
	Pairs []PairLink
}

// DefaultName is the lab name used when none is given.
const DefaultName = "mpi5k"

// Limits that keep names valid as interface/file names and address plans
// inside a /24.
const (
	maxSites = 50
	maxNodes = 80
	// MaxGateways is the most gateway hosts a lab site may have: their
	// LAN addresses .2 to .9 stay below the nodes' .11.
	MaxGateways = 8
	// minQueue keeps the queue able to hold a few packets even when the BDP is
	// tiny (zero delay would otherwise drop every packet).
	minQueueFloor = 64 * 1024
)

var (
	ccNameRE   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,15}$`)
	labNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,23}$`)
	siteNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)
)

// Normalize fills defaults and validates; the returned error names the field.
func (c *Config) Normalize() error {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if err := ValidName(c.Name); err != nil {
		return err
	}
	if len(c.Sites) == 0 {
		c.Sites = []string{"site1", "site2"}
	}
	if len(c.Sites) < 2 || len(c.Sites) > maxSites {
		return fmt.Errorf("sites: need 2..%d sites, got %d", maxSites, len(c.Sites))
	}
	seen := map[string]bool{}
	for _, s := range c.Sites {
		if !siteNameRE.MatchString(s) {
			return fmt.Errorf("sites: bad site name %q (lower-case letter then letters/digits, at most 12)", s)
		}
		if seen[s] {
			return fmt.Errorf("sites: site %q given twice", s)
		}
		seen[s] = true
	}
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.Nodes < 1 || c.Nodes > maxNodes {
		return fmt.Errorf("nodes: need 1..%d nodes per site, got %d", maxNodes, c.Nodes)
	}
	if c.RTT < 0 || c.RTT > 10*time.Second {
		return fmt.Errorf("rtt: %v out of range 0..10s", c.RTT)
	}
	if c.Jitter < 0 || c.Jitter > time.Second {
		return fmt.Errorf("jitter: %v out of range 0..1s", c.Jitter)
	}
	if c.Loss < 0 || c.Loss > 1 || math.IsNaN(c.Loss) {
		return fmt.Errorf("loss: %v out of range 0..1", c.Loss)
	}
	if err := normalizeReorder("", &c.Reorder, &c.ReorderDelay); err != nil {
		return err
	}
	if c.LANLoss < 0 || c.LANLoss > 1 || math.IsNaN(c.LANLoss) {
		return fmt.Errorf("lan-loss: %v out of range 0..1", c.LANLoss)
	}
	if err := c.checkSiteFractions("lan-loss", c.LANLoss, c.SiteLANLoss); err != nil {
		return err
	}
	if err := c.checkSiteFractions("lan-reorder", c.LANReorder, c.SiteLANReorder); err != nil {
		return err
	}
	reorders := slices.ContainsFunc(c.Sites, func(s string) bool { return c.SiteLANReorderOf(s) > 0 })
	switch {
	case c.LANReorderDelay < 0 || c.LANReorderDelay > time.Second:
		return fmt.Errorf("lan-reorder-delay: %v out of range 0..1s", c.LANReorderDelay)
	case c.LANReorderDelay > 0 && !reorders:
		return fmt.Errorf("lan-reorder-delay: %v given without lan-reorder (set lan-reorder too, e.g. 1%%, or drop the delay)", c.LANReorderDelay)
	case reorders && c.LANReorderDelay == 0:
		c.LANReorderDelay = DefaultReorderDelay
	}
	if c.Queue < 0 {
		return fmt.Errorf("queue: negative size %d", c.Queue)
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.MTU < 576 || c.MTU > 9000 {
		return fmt.Errorf("mtu: %d out of range 576..9000", c.MTU)
	}
	if c.CrossMTU == 0 {
		c.CrossMTU = c.MTU
	}
	if c.CrossMTU < c.MTU || c.CrossMTU > 9000 {
		return fmt.Errorf("cross-mtu: %d out of range %d (the MTU)..9000", c.CrossMTU, c.MTU)
	}
	if c.GatewayNICs == 0 {
		c.GatewayNICs = 1
	}
	if c.GatewayNICs != 1 && c.GatewayNICs != 2 {
		return fmt.Errorf("gateway-nics: must be 1 or 2, got %d", c.GatewayNICs)
	}
	if c.Gateways == 0 {
		c.Gateways = 1
	}
	if c.Gateways < 1 || c.Gateways > MaxGateways {
		return fmt.Errorf("gateways: need 1..%d gateway hosts per site, got %d", MaxGateways, c.Gateways)
	}
	if c.HostCC == "system" {
		c.HostCC = ""
	}
	if c.HostCC != "" && !ccNameRE.MatchString(c.HostCC) {
		return fmt.Errorf("host-cc: bad congestion control name %q", c.HostCC)
	}
	if c.Queue == 0 {
		c.Queue = BDPQueue(c.WANRate, c.RTT, c.LinkMTU())
	}
	if c.Queue < 2*c.LinkMTU() {
		return fmt.Errorf("queue: %d bytes cannot hold two %d-byte packets", c.Queue, c.LinkMTU())
	}
	return c.normalizePairs()
}

// GatewaysPerSite is the number of gateway hosts of each site: Gateways,
// or 1 for a state saved before the field existed.
func (c *Config) GatewaysPerSite() int {
	return max(c.Gateways, 1)
}

// LinkMTU is the largest packet the lab's routers and WAN emulator carry:
// CrossMTU when set, else MTU (a state saved before CrossMTU has none).
func (c *Config) LinkMTU() int {
	return max(c.MTU, c.CrossMTU)
}

// DefaultReorderDelay is how long a reordered packet is held back when no
// delay is given: at 100 Mbit/s about 40 full-size packets overtake it, far
// more than TCP's 3 duplicate ACKs, so it reads as a loss repaired by a
// spurious retransmission, the harder case for a receiver.
const DefaultReorderDelay = 5 * time.Millisecond

// normalizeReorder checks a reorder fraction and its delay (what names the
// pair for the error, "" for the lab-wide values) and fills the default
// delay.
func normalizeReorder(what string, frac *float64, delay *time.Duration) error {
	if *frac < 0 || *frac > 1 || math.IsNaN(*frac) {
		return fmt.Errorf("%sreorder: %v out of range 0..1", what, *frac)
	}
	if *delay < 0 || *delay > time.Second {
		return fmt.Errorf("%sreorder-delay: %v out of range 0..1s", what, *delay)
	}
	if *frac == 0 && *delay != 0 {
		return fmt.Errorf("%sreorder-delay: %v given without reorder (set reorder too, e.g. 1%%, or drop the delay)", what, *delay)
	}
	if *frac > 0 && *delay == 0 {
		*delay = DefaultReorderDelay
	}
	return nil
}

// checkSiteFractions checks a lab-wide fraction and its per-site overrides.
func (c *Config) checkSiteFractions(what string, all float64, per map[string]float64) error {
	if all < 0 || all > 1 || math.IsNaN(all) {
		return fmt.Errorf("%s: %v out of range 0..1", what, all)
	}
	for site, f := range per {
		if !slices.Contains(c.Sites, site) {
			return fmt.Errorf("%s: site %q is not one of the lab's sites %v", what, site, c.Sites)
		}
		if f < 0 || f > 1 || math.IsNaN(f) {
			return fmt.Errorf("%s: %s=%v out of range 0..1", what, site, f)
		}
	}
	return nil
}

// SiteLANReorderOf is the LAN reordering of site: its SiteLANReorder
// entry, else LANReorder.
func (c *Config) SiteLANReorderOf(site string) float64 {
	if f, ok := c.SiteLANReorder[site]; ok {
		return f
	}
	return c.LANReorder
}

// SiteLANLossOf is the LAN loss of site: its SiteLANLoss entry, else LANLoss.
func (c *Config) SiteLANLossOf(site string) float64 {
	if f, ok := c.SiteLANLoss[site]; ok {
		return f
	}
	return c.LANLoss
}

// ParseLANLoss parses --lan-loss: "1%" for every site, "site1=1%,site2=0.5%"
// per site, or both ("0.1%,site2=2%": site2 2 %, every other site 0.1 %).
func ParseLANLoss(s string) (all float64, per map[string]float64, err error) {
	return ParseSiteFractions("lan-loss", s)
}

// ParseSiteFractions parses a per-site fraction flag as ParseLANLoss does;
// flag names it in errors.
func ParseSiteFractions(flag, s string) (all float64, per map[string]float64, err error) {
	seenAll := false
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		site, v, ok := strings.Cut(part, "=")
		if !ok {
			if seenAll {
				return 0, nil, fmt.Errorf("--%s: %q gives the every-site value twice (give it once, per-site values as SITE=VALUE)", flag, s)
			}
			seenAll = true
			if all, err = ParseFraction(flag, part); err != nil {
				return 0, nil, err
			}
			continue
		}
		site = strings.TrimSpace(site)
		if !siteNameRE.MatchString(site) {
			return 0, nil, fmt.Errorf("--%s: bad site name %q in %q (want SITE=VALUE, e.g. site1=1%%)", flag, site, s)
		}
		if _, dup := per[site]; dup {
			return 0, nil, fmt.Errorf("--%s: site %s given twice in %q", flag, site, s)
		}
		f, err := ParseFraction(flag, v)
		if err != nil {
			return 0, nil, fmt.Errorf("%w (site %s)", err, site)
		}
		if per == nil {
			per = map[string]float64{}
		}
		per[site] = f
	}
	return all, per, nil
}

// HostTCP names the lab hosts' default congestion control for reports:
// HostCC, or the machine's default marked "(system)".
func (c Config) HostTCP() string {
	if c.HostCC != "" {
		return c.HostCC
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		return "system"
	}
	return strings.TrimSpace(string(b)) + " (system)"
}

// ValidName checks a lab name (it prefixes namespace and directory names).
func ValidName(name string) error {
	if !labNameRE.MatchString(name) {
		return fmt.Errorf("name: bad lab name %q (letters, digits, '_', '-', at most 24, no '.')", name)
	}
	return nil
}

// BDPQueue is the default queue: one bandwidth-delay product, never below
// minQueueFloor (a zero RTT must not drop everything) nor a few MTUs. An
// unlimited rate gets a large fixed queue because nothing builds up anyway.
func BDPQueue(rate uint64, rtt time.Duration, mtu int) int {
	if rate == 0 {
		return 16 << 20
	}
	bdp := float64(rate) / 8 * rtt.Seconds()
	q := int(bdp)
	if q < minQueueFloor {
		q = minQueueFloor
	}
	if q < 4*mtu {
		q = 4 * mtu
	}
	return q
}

// ParseRate parses a rate as units.Rate does; flag names the flag for the
// error message.
func ParseRate(flag, s string) (uint64, error) {
	r, err := units.Rate(s)
	if err != nil {
		return 0, fmt.Errorf("--%s: %w", flag, err)
	}
	return r, nil
}

// ParseLoss parses "0.1%", "1%" or a fraction "0.01".
func ParseLoss(s string) (float64, error) { return ParseFraction("loss", s) }

// ParseFraction parses a probability given as "0.1%", "1%" or a fraction
// "0.01"; flag names the flag for the error message.
func ParseFraction(flag, s string) (float64, error) {
	v := strings.TrimSpace(s)
	pct := strings.HasSuffix(v, "%")
	v = strings.TrimSuffix(v, "%")
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) {
		return 0, fmt.Errorf("--%s: bad value %q (examples: 0.1%%, 1%%, 0.01)", flag, s)
	}
	if pct {
		f /= 100
	}
	if f < 0 || f > 1 {
		return 0, fmt.Errorf("--%s: %q out of range 0..100%%", flag, s)
	}
	return f, nil
}

// ParseQueue parses "1bdp", "0.5bdp" (resolved against rate and RTT) or a
// byte size "256k", "1m", "65536". "" or "0" means the default (1 BDP).
func ParseQueue(s string, rate uint64, rtt time.Duration, mtu int) (int, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "" || v == "0" {
		return 0, nil
	}
	if strings.HasSuffix(v, "bdp") {
		f, err := strconv.ParseFloat(strings.TrimSuffix(v, "bdp"), 64)
		if err != nil || !(f > 0) || f > 1000 {
			return 0, fmt.Errorf("--queue: bad BDP multiple %q (examples: 1bdp, 0.5bdp)", s)
		}
		if rate == 0 {
			return 0, nil // no rate, no BDP: the default (large) queue
		}
		if mtu == 0 {
			mtu = 1500
		}
		q := int(f * float64(BDPQueue(rate, rtt, mtu)))
		return q, nil
	}
	mult := 1.0
	for _, u := range []struct {
		suffix string
		m      float64
	}{{"kb", 1024}, {"mb", 1 << 20}, {"k", 1024}, {"m", 1 << 20}, {"b", 1}} {
		if strings.HasSuffix(v, u.suffix) {
			v = strings.TrimSuffix(v, u.suffix)
			mult = u.m
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || f*mult > 1<<30 {
		return 0, fmt.Errorf("--queue: bad size %q (examples: 1bdp, 256k, 1m, 65536)", s)
	}
	return int(f * mult), nil
}

// ParseSites parses "lyon,rennes" or a count "3" (site1..site3).
func ParseSites(s string) ([]string, error) {
	v := strings.TrimSpace(s)
	if n, err := strconv.Atoi(v); err == nil {
		if n < 2 || n > maxSites {
			return nil, fmt.Errorf("--sites: need 2..%d sites, got %d", maxSites, n)
		}
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("site%d", i+1)
		}
		return out, nil
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		p = strings.TrimSpace(p)
		if !siteNameRE.MatchString(p) {
			return nil, fmt.Errorf("--sites: bad site name %q (lower-case letter then letters/digits, at most 12)", p)
		}
		out = append(out, p)
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("--sites: need at least 2 sites, got %q", s)
	}
	return out, nil
}
