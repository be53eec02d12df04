package testbed

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/units"
)

// PairLink is the WAN between two sites, the same in both directions. Zero
// fields of a pair given in a matrix file were filled from the default line
// or the lab's flags when the file was read (see ParseMatrix).
type PairLink struct {
	A, B   string
	RTT    time.Duration
	Jitter time.Duration
	Rate   uint64  // bit/s per direction, 0 = unlimited
	Loss   float64 // per packet and direction, 0..1
	Queue  int     // bytes, 0 = 1 BDP of this pair
	// Reorder and ReorderDelay as Config's, for this pair.
	Reorder      float64
	ReorderDelay time.Duration
}

// Matrix is a lab's per-pair WAN: the sites it names, in order, and every
// pair written out (defaults already applied).
type Matrix struct {
	Sites []string
	Pairs []PairLink
}

// ParseMatrixFile reads a distance matrix file (format: testbed/README.md,
// "Distance matrix"). def gives the values of pairs the file leaves out when
// it has no `default` line (the --rtt, --wan-rate, --loss, --jitter and
// --queue flags).
func ParseMatrixFile(path string, def PairLink) (*Matrix, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--matrix: %w", err)
	}
	defer f.Close()
	return ParseMatrix(path, f, def)
}

// ParseMatrix parses a distance matrix. Lines:
//
//	sites rennes nantes lille        (optional; else sites in order of first mention)
//	default rtt=20ms rate=200mbit    (optional; values for pairs not listed)
//	rennes nantes rtt=4ms rate=1gbit loss=0.01% jitter=0.1ms queue=1bdp reorder=1% reorder-delay=5ms
//
// Every error names name:line, what is wrong and what is accepted.
func ParseMatrix(name string, r io.Reader, def PairLink) (*Matrix, error) {
	m := &Matrix{}
	var declared []string
	seenSite := map[string]bool{}
	addSite := func(s string) {
		if !seenSite[s] {
			seenSite[s] = true
			m.Sites = append(m.Sites, s)
		}
	}
	type entry struct {
		p    PairLink
		set  map[string]bool
		line int
	}
	var entries []entry
	seenPair := map[[2]string]int{}
	defaultLine := 0
	defSet := map[string]bool{}
	sc := bufio.NewScanner(r)
	ln := 0
	for sc.Scan() {
		ln++
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		at := fmt.Sprintf("%s:%d", name, ln)
		switch f[0] {
		case "sites":
			if declared != nil {
				return nil, fmt.Errorf("%s: second `sites` line (list every site on one line)", at)
			}
			if len(m.Sites) > 0 {
				return nil, fmt.Errorf("%s: `sites` must come before the first pair line", at)
			}
			if len(f) < 3 {
				return nil, fmt.Errorf("%s: `sites` needs at least 2 site names, e.g. `sites rennes nantes`", at)
			}
			for _, s := range f[1:] {
				if !siteNameRE.MatchString(s) {
					return nil, fmt.Errorf("%s: bad site name %q (lower-case letter then letters/digits, at most 12)", at, s)
				}
				if seenSite[s] {
					return nil, fmt.Errorf("%s: site %q listed twice", at, s)
				}
				addSite(s)
			}
			declared = m.Sites
		case "default":
			if defaultLine != 0 {
				return nil, fmt.Errorf("%s: second `default` line (the first is line %d; keep one)", at, defaultLine)
			}
			if len(entries) > 0 {
				return nil, fmt.Errorf("%s: `default` must come before the first pair line", at)
			}
			defaultLine = ln
			if err := parsePairValues(at, f[1:], &def, defSet); err != nil {
				return nil, err
			}
		default:
			if len(f) < 2 || strings.Contains(f[1], "=") {
				return nil, fmt.Errorf("%s: want `SITE SITE key=value...`, `sites ...` or `default key=value...`, got %q", at, strings.TrimSpace(line))
			}
			a, b := f[0], f[1]
			for _, s := range []string{a, b} {
				if !siteNameRE.MatchString(s) {
					return nil, fmt.Errorf("%s: bad site name %q (lower-case letter then letters/digits, at most 12)", at, s)
				}
				if declared != nil && !seenSite[s] {
					return nil, fmt.Errorf("%s: site %q is not on the `sites` line (add it there)", at, s)
				}
			}
			if a == b {
				return nil, fmt.Errorf("%s: pair %s %s joins a site to itself (name two different sites)", at, a, b)
			}
			key := [2]string{min(a, b), max(a, b)}
			if prev, ok := seenPair[key]; ok {
				return nil, fmt.Errorf("%s: pair %s %s already given on line %d (links are symmetric: give each pair once)", at, a, b, prev)
			}
			seenPair[key] = ln
			addSite(a)
			addSite(b)
			e := entry{p: PairLink{A: a, B: b}, set: map[string]bool{}, line: ln}
			if err := parsePairValues(at, f[2:], &e.p, e.set); err != nil {
				return nil, err
			}
			entries = append(entries, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(m.Sites) < 2 {
		return nil, fmt.Errorf("%s: names fewer than 2 sites (add a `sites` line or pair lines)", name)
	}
	if len(m.Sites) > maxSites {
		return nil, fmt.Errorf("%s: names %d sites, at most %d are possible", name, len(m.Sites), maxSites)
	}
	given := map[[2]string]*entry{}
	for i := range entries {
		e := &entries[i]
		given[[2]string{e.p.A, e.p.B}] = e
		given[[2]string{e.p.B, e.p.A}] = e
	}
	for i, a := range m.Sites {
		for _, b := range m.Sites[i+1:] {
			p := def
			p.A, p.B = a, b
			if e := given[[2]string{a, b}]; e != nil {
				// A pair line overrides only the keys it names.
				if e.set["rtt"] {
					p.RTT = e.p.RTT
				}
				if e.set["rate"] {
					p.Rate = e.p.Rate
				}
				if e.set["loss"] {
					p.Loss = e.p.Loss
				}
				if e.set["jitter"] {
					p.Jitter = e.p.Jitter
				}
				if e.set["queue"] {
					p.Queue = e.p.Queue
				}
				if e.set["reorder"] {
					p.Reorder = e.p.Reorder
				}
				if e.set["reorder-delay"] {
					p.ReorderDelay = e.p.ReorderDelay
				}
				if p.Reorder == 0 && !e.set["reorder-delay"] {
					// A pair without reordering takes no inherited delay;
					// one given on its own line is still refused.
					p.ReorderDelay = 0
				}
			}
			m.Pairs = append(m.Pairs, p)
		}
	}
	return m, nil
}

// parsePairValues reads key=value fields into p, recording the keys given.
func parsePairValues(at string, fields []string, p *PairLink, set map[string]bool) error {
	var queue string
	for _, kv := range fields {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return fmt.Errorf("%s: %q is not key=value (keys: rtt, rate, loss, jitter, queue, reorder, reorder-delay)", at, kv)
		}
		if set[k] {
			return fmt.Errorf("%s: %s given twice", at, k)
		}
		set[k] = true
		var err error
		switch k {
		case "rtt", "jitter", "reorder-delay":
			var d time.Duration
			d, err = time.ParseDuration(v)
			if err == nil && (d < 0 || (k == "rtt" && d > 10*time.Second) || (k != "rtt" && d > time.Second)) {
				err = fmt.Errorf("out of range")
			}
			if err != nil {
				return fmt.Errorf("%s: %s=%s: want a duration (e.g. 4ms, 0.5ms; rtt 0..10s, jitter and reorder-delay 0..1s)", at, k, v)
			}
			switch k {
			case "rtt":
				p.RTT = d
			case "jitter":
				p.Jitter = d
			default:
				p.ReorderDelay = d
			}
		case "rate":
			if p.Rate, err = units.Rate(v); err != nil {
				return fmt.Errorf("%s: rate=%s: %v (e.g. 200mbit, 1gbit, 0 = unlimited)", at, v, err)
			}
		case "loss":
			if p.Loss, err = ParseLoss(v); err != nil {
				return fmt.Errorf("%s: loss=%s: want 0..100%% (e.g. 0.1%%, 0.001)", at, v)
			}
		case "reorder":
			if p.Reorder, err = ParseFraction("reorder", v); err != nil {
				return fmt.Errorf("%s: reorder=%s: want 0..100%% (e.g. 1%%, 0.01)", at, v)
			}
		case "queue":
			queue = v
		default:
			return fmt.Errorf("%s: unknown key %q (keys: rtt, rate, loss, jitter, queue, reorder, reorder-delay)", at, k)
		}
	}
	if queue != "" {
		// Resolved after rate and RTT, whatever their order on the line.
		q, err := ParseQueue(queue, p.Rate, p.RTT, 0)
		if err != nil {
			return fmt.Errorf("%s: queue=%s: want 1bdp, 0.5bdp or a size (256k, 1m)", at, queue)
		}
		p.Queue = q
	}
	return nil
}

// normalizePairs checks c.Pairs against c.Sites and fills each pair's
// queue; pairs not given take the lab-wide values.
func (c *Config) normalizePairs() error {
	if len(c.Pairs) == 0 {
		return nil
	}
	idx := map[string]int{}
	for i, s := range c.Sites {
		idx[s] = i
	}
	seen := map[[2]int]bool{}
	for i := range c.Pairs {
		p := &c.Pairs[i]
		ia, oka := idx[p.A]
		ib, okb := idx[p.B]
		if !oka || !okb {
			return fmt.Errorf("pairs: pair %s-%s names a site not in sites %v", p.A, p.B, c.Sites)
		}
		if ia == ib {
			return fmt.Errorf("pairs: pair %s-%s joins a site to itself", p.A, p.B)
		}
		k := [2]int{min(ia, ib), max(ia, ib)}
		if seen[k] {
			return fmt.Errorf("pairs: pair %s-%s given twice", p.A, p.B)
		}
		seen[k] = true
		switch {
		case p.RTT < 0 || p.RTT > 10*time.Second:
			return fmt.Errorf("pairs: %s-%s rtt %v out of range 0..10s", p.A, p.B, p.RTT)
		case p.Jitter < 0 || p.Jitter > time.Second:
			return fmt.Errorf("pairs: %s-%s jitter %v out of range 0..1s", p.A, p.B, p.Jitter)
		case p.Loss < 0 || p.Loss > 1 || math.IsNaN(p.Loss):
			return fmt.Errorf("pairs: %s-%s loss %v out of range 0..1", p.A, p.B, p.Loss)
		case p.Queue < 0:
			return fmt.Errorf("pairs: %s-%s negative queue %d", p.A, p.B, p.Queue)
		}
		if err := normalizeReorder(fmt.Sprintf("pairs: %s-%s ", p.A, p.B), &p.Reorder, &p.ReorderDelay); err != nil {
			return err
		}
		if p.Queue == 0 {
			p.Queue = BDPQueue(p.Rate, p.RTT, c.LinkMTU())
		}
		if p.Queue < 2*c.LinkMTU() {
			return fmt.Errorf("pairs: %s-%s queue of %d bytes cannot hold two %d-byte packets", p.A, p.B, p.Queue, c.LinkMTU())
		}
	}
	return nil
}

// Pair returns the WAN between sites a and b: the matching entry of Pairs,
// else the lab-wide values.
func (c *Config) Pair(a, b string) PairLink {
	for _, p := range c.Pairs {
		if (p.A == a && p.B == b) || (p.A == b && p.B == a) {
			return p
		}
	}
	return PairLink{A: a, B: b, RTT: c.RTT, Jitter: c.Jitter, Rate: c.WANRate, Loss: c.Loss, Queue: c.Queue,
		Reorder: c.Reorder, ReorderDelay: c.ReorderDelay}
}

// MaxRTT is the longest RTT between any two sites.
func (c *Config) MaxRTT() time.Duration {
	m := c.RTT
	for _, p := range c.Pairs {
		m = max(m, p.RTT)
	}
	return m
}
