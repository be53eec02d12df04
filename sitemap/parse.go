package sitemap

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// maxLine bounds one record; a host may list many addresses, but a longer
// line is certainly not a site map.
const maxLine = 1 << 20

// Parse reads a site map in the text format (docs/sitemap-format.md) and
// validates it. filename is only used in error messages. Records may come in
// any order. Every problem found is reported as "file:line: reason"; the
// returned error joins them (each one is an *Error), sorted by line.
func Parse(r io.Reader, filename string) (*Map, error) {
	var (
		recs   records
		errs   []*Error
		broken = map[string]bool{}
	)
	fail := func(line int, format string, args ...any) {
		errs = append(errs, &Error{File: filename, Line: line, Msg: fmt.Sprintf(format, args...)})
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		at := pos{filename, line}
		switch f[0] {
		case "site":
			s, err := parseSite(f, at)
			if err != "" {
				fail(line, "%s", err)
				if s.name != "" {
					broken[s.name] = true
				}
				continue
			}
			recs.sites = append(recs.sites, s)
		case "net":
			if len(f) != 3 {
				fail(line, "net: want \"net <site> <cidr>\", got %d fields", len(f))
				continue
			}
			p, err := netip.ParsePrefix(f[2])
			if err != nil {
				fail(line, "net %s: bad CIDR %q: %s", f[1], f[2], reason(err))
				continue
			}
			recs.nets = append(recs.nets, netRec{at: at, site: f[1], prefix: p})
		case "host":
			if len(f) < 4 {
				fail(line, "host: want \"host <site> <hostname> <addr> [<addr>...]\", got %d fields", len(f))
				continue
			}
			h := hostRec{at: at, site: f[1], name: f[2]}
			bad := false
			for _, v := range f[3:] {
				a, err := netip.ParseAddr(v)
				if err != nil {
					fail(line, "host %s: bad address %q: %s", f[2], v, reason(err))
					bad = true
					continue
				}
				h.addrs = append(h.addrs, a)
			}
			if !bad {
				recs.hosts = append(recs.hosts, h)
			}
		case "gateway":
			g, err := parseGateway(f, at)
			if err != "" {
				fail(line, "%s", err)
				continue
			}
			recs.gateways = append(recs.gateways, g)
		case "key":
			if len(f) != 3 {
				fail(line, "key: want \"key <site> %s<base64>\", got %d fields", KeyPrefix, len(f))
				continue
			}
			k, err := ParseKey(f[2])
			if err != nil {
				fail(line, "key %s: %v", f[1], err)
				continue
			}
			recs.keys = append(recs.keys, keyRec{at: at, site: f[1], key: k})
		default:
			fail(line, "unknown record %q: want site, gateway, key, net or host", f[0])
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			fail(line+1, "line longer than %d bytes", maxLine)
		} else {
			return nil, fmt.Errorf("%s: %w", filename, err)
		}
	}
	m, verrs := recs.build(broken)
	errs = append(errs, verrs...)
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	return m, nil
}

// parseSite parses `site <name> id=<n> lan=<ip:port> wan=<ip:port>`; keys may
// come in any order. Missing keys are left zero for the shared validation to
// report (so the builder gets the same messages).
func parseSite(f []string, at pos) (siteRec, string) {
	s := siteRec{at: at}
	if len(f) < 2 {
		return s, "site: missing name"
	}
	s.name = f[1]
	if strings.Contains(s.name, "=") {
		return siteRec{}, fmt.Sprintf("site: missing name before %q", s.name)
	}
	seen := map[string]bool{}
	for _, kv := range f[2:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return s, fmt.Sprintf("site %s: bad field %q: want key=value", s.name, kv)
		}
		if seen[k] {
			return s, fmt.Sprintf("site %s: duplicate key %s", s.name, k)
		}
		seen[k] = true
		switch k {
		case "id":
			if v == "" || strings.Trim(v, "0123456789") != "" {
				return s, fmt.Sprintf("site %s: bad id %q: want a number 1-255", s.name, v)
			}
			n, err := strconv.Atoi(v)
			if err != nil || n > 255 {
				return s, fmt.Sprintf("site %s: id %s out of range 1-255", s.name, v)
			}
			if n == 0 {
				// 0 must not look like "missing" to the validation.
				return s, fmt.Sprintf("site %s: id 0 out of range 1-255", s.name)
			}
			s.id = n
		case "lan", "wan", "ready":
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return s, fmt.Sprintf("site %s: bad %s address %q: want ip:port ([ipv6]:port): %s", s.name, k, v, reason(err))
			}
			switch k {
			case "lan":
				s.lan = ap
			case "wan":
				s.wan = ap
			default:
				s.ready = ap
			}
		case "nat":
			switch v {
			case "yes":
				s.nat = true
			case "no":
			default:
				return s, fmt.Sprintf("site %s: bad nat %q: want yes or no", s.name, v)
			}
		default:
			return s, fmt.Sprintf("site %s: unknown key %q (want id, lan, wan, ready, nat)", s.name, k)
		}
	}
	return s, ""
}

// parseGateway parses `gateway <site> lan=<ip:port> wan=<ip:port>`, another
// gateway host of a site; the keys may come in either order.
func parseGateway(f []string, at pos) (gatewayRec, string) {
	g := gatewayRec{at: at}
	if len(f) < 2 || strings.Contains(f[1], "=") {
		return g, "gateway: missing site name: want \"gateway <site> lan=<ip:port> wan=<ip:port>\""
	}
	g.site = f[1]
	seen := map[string]bool{}
	for _, kv := range f[2:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return g, fmt.Sprintf("gateway %s: bad field %q: want key=value", g.site, kv)
		}
		if k != "lan" && k != "wan" {
			return g, fmt.Sprintf("gateway %s: unknown key %q (want lan, wan; id, ready and nat are the site's)", g.site, k)
		}
		if seen[k] {
			return g, fmt.Sprintf("gateway %s: duplicate key %s", g.site, k)
		}
		seen[k] = true
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			return g, fmt.Sprintf("gateway %s: bad %s address %q: want ip:port ([ipv6]:port): %s", g.site, k, v, reason(err))
		}
		if k == "lan" {
			g.lan = ap
		} else {
			g.wan = ap
		}
	}
	return g, ""
}

// reason strips the netip function prefix from a parse error: the caller
// already quotes the input.
func reason(err error) string {
	msg := err.Error()
	// Fields hold no spaces, so the first "): " ends the quoted input.
	if i := strings.Index(msg, "): "); i >= 0 {
		return msg[i+3:]
	}
	return msg
}
