package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
)

// Edge colours of the communication graph.
const (
	ColorWAN   = "red"
	ColorLAN   = "blue"
	ColorOther = "gray50"
)

// WriteDOT writes the communication graph of r in graphviz DOT: one box per
// host inside a cluster per site, one edge per host pair that wrote data,
// labelled with writes and bytes; WAN edges red, LAN blue. Connections of
// a host with itself (loopback: the MPI runtime's own control traffic) are
// left out: they would only draw loops on every box.
func WriteDOT(w io.Writer, r *Report) error {
	b := &bytes.Buffer{}
	fmt.Fprintf(b, "digraph mpi5k {\n")
	fmt.Fprintf(b, "\tgraph [rankdir=LR, fontname=\"Helvetica\", label=%s, labelloc=t, nodesep=0.6, ranksep=2.2, pad=1.2];\n", dotQuote("communication: "+r.Dir))
	fmt.Fprintf(b, "\tnode [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\"];\n")
	fmt.Fprintf(b, "\tedge [fontname=\"Helvetica\", fontsize=9];\n")

	// Hosts: traced ones from the processes, untraced ones from peers.
	hostSite := map[string]string{}
	procs := map[string]int{}
	for _, p := range r.Procs {
		hostSite[p.Host] = p.Site
		procs[p.Host]++
	}
	var edges []*PairReport
	for _, p := range r.HostPairs {
		if p.From == p.To || p.Writes == 0 {
			continue
		}
		edges = append(edges, p)
		if _, ok := hostSite[p.To]; !ok {
			hostSite[p.To] = UnknownSite
		}
	}
	// Peer sites of untraced hosts come from the connections.
	for _, c := range r.Connections {
		if s, ok := hostSite[c.Conn.PeerHost]; ok && s == UnknownSite && c.Conn.PeerSite != UnknownSite {
			hostSite[c.Conn.PeerHost] = c.Conn.PeerSite
		}
	}
	bySite := map[string][]string{}
	for h, s := range hostSite {
		bySite[s] = append(bySite[s], h)
	}
	sites := make([]string, 0, len(bySite))
	for s := range bySite {
		sites = append(sites, s)
	}
	sort.Strings(sites)
	for i, s := range sites {
		hs := bySite[s]
		sort.Strings(hs)
		label := "site " + s
		if s == UnknownSite {
			label = "unknown site"
		}
		fmt.Fprintf(b, "\tsubgraph cluster_%d {\n\t\tlabel=%s; style=\"rounded,filled\"; fillcolor=\"gray95\"; color=\"gray60\";\n", i, dotQuote(label))
		for _, h := range hs {
			l := h
			if n := procs[h]; n > 0 {
				l = fmt.Sprintf("%s\\n%d traced process%s", h, n, plural(n, "es"))
			} else if h == UnknownSite {
				l = "unknown peer\\n(fd opened before tracing)"
			} else {
				l = h + "\\n(not traced)"
			}
			fmt.Fprintf(b, "\t\t%s [label=\"%s\"];\n", dotQuote(h), dotEsc(l))
		}
		fmt.Fprintf(b, "\t}\n")
	}
	// One edge per host pair, both directions on it: two opposite edges
	// would be drawn on top of each other with unreadable labels.
	var pairs []*edgePair
	idx := map[[2]string]*edgePair{}
	for _, e := range edges {
		// Ordered by site, then host: WAN edges all point the same way, so
		// dot ranks the sites' hosts in rows.
		k, fwd := [2]string{e.From, e.To}, true
		if hostSite[e.To]+"\x00"+e.To < hostSite[e.From]+"\x00"+e.From {
			k, fwd = [2]string{e.To, e.From}, false
		}
		u := idx[k]
		if u == nil {
			u = &edgePair{a: k[0], b: k[1]}
			idx[k] = u
			pairs = append(pairs, u)
		}
		if fwd {
			u.ab = e
		} else {
			u.ba = e
		}
	}
	var maxBytes int64 = 1
	for _, u := range pairs {
		maxBytes = max(maxBytes, u.bytes())
	}
	for _, u := range pairs {
		sc := ScopeUnknown
		var lines []string
		dir := "none"
		for i, e := range []*PairReport{u.ab, u.ba} {
			if e == nil {
				continue
			}
			sc = e.Scope
			lines = append(lines, fmt.Sprintf("%s -> %s: %d writes, %s", e.From, e.To, e.Writes, FormatBytes(e.Bytes)))
			switch {
			case dir == "none" && i == 0:
				dir = "forward"
			case dir == "none":
				dir = "back"
			default:
				dir = "both"
			}
		}
		col := ColorOther
		switch sc {
		case ScopeWAN:
			col = ColorWAN
		case ScopeLAN:
			col = ColorLAN
		}
		// Pen width grows with the share of bytes, so heavy pairs stand out.
		pw := 1 + 3*float64(u.bytes())/float64(maxBytes)
		// Edges inside a site do not rank: the site's hosts stay in one row.
		extra := ""
		if sc != ScopeWAN {
			extra = ", constraint=false"
		}
		fmt.Fprintf(b, "\t%s -> %s [dir=%s, color=%s, fontcolor=%s, penwidth=%.2f%s, label=\"%s\"];\n",
			dotQuote(u.a), dotQuote(u.b), dir, col, col, pw, extra, dotEsc(strings.Join(lines, "\\n")))
	}
	fmt.Fprintf(b, "}\n")
	_, err := w.Write(b.Bytes())
	return err
}

// edgePair is the traffic between two hosts, per direction (nil: none).
type edgePair struct {
	a, b   string
	ab, ba *PairReport
}

func (u *edgePair) bytes() int64 {
	var n int64
	if u.ab != nil {
		n += u.ab.Bytes
	}
	if u.ba != nil {
		n += u.ba.Bytes
	}
	return n
}

func plural(n int, s string) string {
	if n == 1 {
		return ""
	}
	return s
}

func dotEsc(s string) string {
	return strings.NewReplacer(`"`, `\"`).Replace(s)
}

func dotQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// ErrNoDot: graphviz is not installed.
var ErrNoDot = errors.New("graphviz 'dot' not found in PATH (install the Debian package graphviz, or write DOT only with -o FILE.dot)")

// RenderDOT runs graphviz dot on src and returns the output in format
// (svg, png, pdf, ...).
func RenderDOT(src []byte, format string) ([]byte, error) {
	dot, err := exec.LookPath("dot")
	if err != nil {
		return nil, ErrNoDot
	}
	cmd := exec.Command(dot, "-T"+format)
	cmd.Stdin = bytes.NewReader(src)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("dot -T%s: %v: %s", format, err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}
