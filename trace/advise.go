package trace

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// RankGraph is the traffic between the MPI ranks of a traced run: what
// each rank wrote to each other rank, matched through the connections'
// endpoints (a connection's local and true peer endpoints are its far
// end's peer and local ones, relayed or not).
type RankGraph struct {
	N     int
	Host  []string  // the host each rank ran on
	Site  []string  // the site each rank ran in
	Bytes [][]int64 // Bytes[i][j]: bytes rank i wrote to rank j
	Msgs  [][]int64 // Msgs[i][j]: writes of rank i to rank j
	// Unmatched counts bytes written on connections whose far end is no
	// traced rank (the launcher, a process traced without a rank).
	Unmatched int64
}

// rankEnvs names what the shim reads the rank from, for error messages.
const rankEnvs = "OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID"

// NewRankGraph builds the rank graph of t. Every rank 0..N-1 must have
// exactly one traced process; processes without a rank (the launcher's
// helpers) are left out.
func NewRankGraph(t *Trace) (*RankGraph, error) {
	type hp struct {
		host string
		pid  uint32
	}
	byProc := map[hp]int{}
	n := 0
	for _, p := range t.Procs {
		if p.Rank < 0 {
			continue
		}
		n = max(n, int(p.Rank)+1)
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no trace records an MPI rank (traced before ranks were recorded, or the launcher set none of %s)", t.Dir, rankEnvs)
	}
	g := &RankGraph{N: n, Host: make([]string, n), Site: make([]string, n)}
	owner := make([]*Proc, n)
	for _, p := range t.Procs {
		if p.Rank < 0 {
			continue
		}
		if q := owner[p.Rank]; q != nil {
			return nil, fmt.Errorf("%s: rank %d is claimed by both %s and %s (traces of two runs in one directory? trace each run into its own)", t.Dir, p.Rank, q.File, p.File)
		}
		owner[p.Rank] = p
		byProc[hp{p.Host, p.PID}] = int(p.Rank)
		g.Host[p.Rank], g.Site[p.Rank] = p.Host, p.Site
	}
	for r, p := range owner {
		if p == nil {
			return nil, fmt.Errorf("%s: no trace of rank %d among ranks 0..%d (its process was not traced, or its trace was lost)", t.Dir, r, n-1)
		}
		if p.Site == "" || p.Site == UnknownSite {
			return nil, fmt.Errorf("%s: rank %d (%s) ran in an unknown site: pass the run's site map with --map", t.Dir, r, p.File)
		}
	}
	g.Bytes, g.Msgs = square(n), square(n)
	type ends struct{ local, peer netip.AddrPort }
	rankOf := map[ends]int{}
	for _, c := range t.Conns {
		if r, ok := byProc[hp{c.Host, c.PID}]; ok && c.Local.IsValid() && c.Peer.IsValid() {
			rankOf[ends{c.Local, c.Peer}] = r
		}
	}
	for _, c := range t.Conns {
		i, ok := byProc[hp{c.Host, c.PID}]
		if !ok {
			continue
		}
		var bytes int64
		for _, w := range c.Writes {
			bytes += w.Size
		}
		j, ok := rankOf[ends{c.Peer, c.Local}]
		if !ok || j == i {
			if !ok {
				g.Unmatched += bytes
			}
			continue
		}
		g.Bytes[i][j] += bytes
		g.Msgs[i][j] += int64(len(c.Writes))
	}
	return g, nil
}

func square(n int) [][]int64 {
	m := make([][]int64, n)
	for i := range m {
		m[i] = make([]int64, n)
	}
	return m
}

// cut sums m[i][j] over rank pairs placed in different sites.
func cut(m [][]int64, part []int) int64 {
	var c int64
	for i := range m {
		for j, v := range m[i] {
			if part[i] != part[j] {
				c += v
			}
		}
	}
	return c
}

// Partition places the ranks of the symmetric weight matrix w into sites
// holding caps[s] ranks each (sum(caps) = len(w)), starting from init (a
// placement that fits caps), so that the weight between sites is as small
// as it finds. Kernighan–Lin: passes of tentative best swaps between
// sites, each rank moved at most once per pass, keeping the best prefix of
// each pass; swaps keep every site's rank count. It starts from init and
// from a greedy placement (each site grown from its heaviest free rank by
// the rank most attached to it) and returns the better result; never
// worse than init.
func Partition(w [][]int64, caps []int, init []int) []int {
	best := klRefine(w, len(caps), slices.Clone(init))
	if g := klRefine(w, len(caps), greedyPlace(w, caps)); cut(w, g) < cut(w, best) {
		best = g
	}
	return best
}

// greedyPlace grows the sites one after another.
func greedyPlace(w [][]int64, caps []int) []int {
	n := len(w)
	part := make([]int, n)
	for i := range part {
		part[i] = -1
	}
	total := make([]int64, n)
	for i := range w {
		for _, v := range w[i] {
			total[i] += v
		}
	}
	attach := make([]int64, n)
	for s, c := range caps {
		clear(attach)
		for k := 0; k < c; k++ {
			pick := -1
			for i := 0; i < n; i++ {
				if part[i] >= 0 {
					continue
				}
				if pick < 0 || attach[i] > attach[pick] || (attach[i] == attach[pick] && k == 0 && total[i] > total[pick]) {
					pick = i
				}
			}
			part[pick] = s
			for i := 0; i < n; i++ {
				attach[i] += w[pick][i]
			}
		}
	}
	return part
}

// klRefine runs Kernighan–Lin passes until one gains nothing.
func klRefine(w [][]int64, k int, part []int) []int {
	n := len(w)
	// d[i][s]: weight between rank i and the ranks in site s.
	d := make([][]int64, n)
	for i := range d {
		d[i] = make([]int64, k)
		for j, v := range w[i] {
			d[i][part[j]] += v
		}
	}
	move := func(i, to int) {
		from := part[i]
		for j, v := range w[i] {
			if v != 0 {
				d[j][from] -= v
				d[j][to] += v
			}
		}
		part[i] = to
	}
	locked := make([]bool, n)
	type swap struct{ i, j int }
	for pass := 0; pass < 50; pass++ {
		clear(locked)
		var seq []swap
		var gain, bestGain int64
		bestLen := 0
		for step := 0; step < n/2; step++ {
			bi, bj := -1, -1
			var bg int64
			for i := 0; i < n; i++ {
				if locked[i] {
					continue
				}
				for j := i + 1; j < n; j++ {
					pi, pj := part[i], part[j]
					if locked[j] || pi == pj {
						continue
					}
					g := d[i][pj] - d[i][pi] + d[j][pi] - d[j][pj] - 2*w[i][j]
					if bi < 0 || g > bg {
						bi, bj, bg = i, j, g
					}
				}
			}
			if bi < 0 {
				break
			}
			pi, pj := part[bi], part[bj]
			move(bi, pj)
			move(bj, pi)
			locked[bi], locked[bj] = true, true
			seq = append(seq, swap{bi, bj})
			gain += bg
			if gain > bestGain {
				bestGain, bestLen = gain, len(seq)
			}
		}
		for x := len(seq) - 1; x >= bestLen; x-- { // undo past the best prefix
			i, j := seq[x].i, seq[x].j
			pi, pj := part[i], part[j]
			move(i, pj)
			move(j, pi)
		}
		if bestGain <= 0 {
			break
		}
	}
	return part
}

// Advice is a proposed rank placement and what it should save.
type Advice struct {
	Sites            []string // in the order of the trace
	Caps             []int    // ranks per site, as in the run
	Site             []string // proposed site per rank
	Host             []string // proposed host per rank
	Moved            int      // ranks that change site
	WANBytesBefore   int64
	WANBytesAfter    int64
	WANMsgsBefore    int64
	WANMsgsAfter     int64
	UnmatchedBytes   int64
	CurrentSite      []string
	CurrentHost      []string
	hostsOrder       []string
	slotsPerHostSite map[string]int
}

// Advise proposes a rank-to-site placement for g with the run's sites and
// their rank counts, minimising the bytes that cross sites, then maps the
// ranks onto the run's hosts (a rank that stays in its site keeps its
// host; every host keeps its number of ranks).
func Advise(g *RankGraph) *Advice {
	a := &Advice{CurrentSite: g.Site, CurrentHost: g.Host, UnmatchedBytes: g.Unmatched, slotsPerHostSite: map[string]int{}}
	idx := map[string]int{}
	init := make([]int, g.N)
	hostSite := map[string]string{}
	for r := 0; r < g.N; r++ {
		s := g.Site[r]
		if _, ok := idx[s]; !ok {
			idx[s] = len(a.Sites)
			a.Sites = append(a.Sites, s)
			a.Caps = append(a.Caps, 0)
		}
		init[r] = idx[s]
		a.Caps[idx[s]]++
		if _, ok := hostSite[g.Host[r]]; !ok {
			a.hostsOrder = append(a.hostsOrder, g.Host[r])
		}
		hostSite[g.Host[r]] = s
		a.slotsPerHostSite[g.Host[r]]++
	}
	w := square(g.N)
	msgs := square(g.N)
	for i := range w {
		for j := range w {
			w[i][j] = g.Bytes[i][j] + g.Bytes[j][i]
			msgs[i][j] = g.Msgs[i][j]
		}
	}
	part := Partition(w, a.Caps, init)
	a.WANBytesBefore, a.WANBytesAfter = cut(g.Bytes, init), cut(g.Bytes, part)
	a.WANMsgsBefore, a.WANMsgsAfter = cut(msgs, init), cut(msgs, part)
	a.Site, a.Host = make([]string, g.N), make([]string, g.N)
	free := map[string]int{}
	for h, n := range a.slotsPerHostSite {
		free[h] = n
	}
	var homeless []int
	for r := 0; r < g.N; r++ {
		a.Site[r] = a.Sites[part[r]]
		if part[r] == init[r] {
			a.Host[r] = g.Host[r]
			free[g.Host[r]]--
		} else {
			a.Moved++
			homeless = append(homeless, r)
		}
	}
	for _, r := range homeless {
		for _, h := range a.hostsOrder {
			if hostSite[h] == a.Site[r] && free[h] > 0 {
				a.Host[r] = h
				free[h]--
				break
			}
		}
	}
	return a
}

// Host file formats of WriteHostFile.
const (
	FormatMachinefile = "machinefile" // one host per line, in rank order (MPICH/Hydra -f)
	FormatRankfile    = "rankfile"    // Open MPI --rankfile: rank N=host slot=K
)

// WriteHostFile writes the proposed placement in format.
func (a *Advice) WriteHostFile(w io.Writer, format string) error {
	var b strings.Builder
	switch format {
	case FormatMachinefile:
		for _, h := range a.Host {
			fmt.Fprintf(&b, "%s\n", h)
		}
	case FormatRankfile:
		slot := map[string]int{}
		for r, h := range a.Host {
			fmt.Fprintf(&b, "rank %d=%s slot=%d\n", r, h, slot[h])
			slot[h]++
		}
	default:
		return fmt.Errorf("host file format %q: want %s or %s", format, FormatMachinefile, FormatRankfile)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteText summarises the advice for people.
func (a *Advice) WriteText(w io.Writer) error {
	var b strings.Builder
	pct := func(before, after int64) string {
		if before == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%+.1f %%", 100*float64(after-before)/float64(before))
	}
	fmt.Fprintf(&b, "%d ranks in %d sites (", len(a.Site), len(a.Sites))
	for i, s := range a.Sites {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", s, a.Caps[i])
	}
	fmt.Fprintf(&b, "); %d ranks change site\n", a.Moved)
	fmt.Fprintf(&b, "WAN bytes:    %s -> %s (%s)\n", FormatBytes(a.WANBytesBefore), FormatBytes(a.WANBytesAfter), pct(a.WANBytesBefore, a.WANBytesAfter))
	fmt.Fprintf(&b, "WAN messages: %d -> %d (%s)  (messages = write calls)\n", a.WANMsgsBefore, a.WANMsgsAfter, pct(a.WANMsgsBefore, a.WANMsgsAfter))
	if a.UnmatchedBytes > 0 {
		fmt.Fprintf(&b, "(%s written to processes that are no traced rank are not counted)\n", FormatBytes(a.UnmatchedBytes))
	}
	moves := map[[2]string][]int{}
	var keys [][2]string
	for r := range a.Site {
		if a.Site[r] != a.CurrentSite[r] {
			k := [2]string{a.CurrentSite[r], a.Site[r]}
			if moves[k] == nil {
				keys = append(keys, k)
			}
			moves[k] = append(moves[k], r)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s -> %s: ranks %s\n", k[0], k[1], joinInts(moves[k]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
