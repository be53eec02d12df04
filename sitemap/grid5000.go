package sitemap

import "strings"

// Grid5000Site returns the site of a host named by the Grid'5000 convention
// <cluster>-<n>.<site>[.<domain>...], e.g. graphene-12.nancy.grid5000.fr ->
// nancy, or node-1.site1 -> site1 (the lab's names, without a domain).
//
// The first label may carry the suffixes Grid'5000 uses for other interfaces
// of the same node: "-kavlan-<k>" (node in a KaVLAN), an interface name such
// as "-eth1" or "-ib0", and "-ipv6", in any combination, e.g.
// graphene-12-eth1-kavlan-4.nancy.grid5000.fr. A name whose first label is
// not <cluster>-<n> (gw.site1, frontend.nancy.grid5000.fr), a bare name
// (graphene-12) or an IP address has no site. The site is returned as
// written; a trailing root dot is accepted.
func Grid5000Site(hostname string) (site string, ok bool) {
	name := strings.TrimSuffix(hostname, ".")
	first, rest, found := strings.Cut(name, ".")
	if !found || checkHostName(name) != nil {
		return "", false
	}
	site, _, _ = strings.Cut(rest, ".")
	if !isG5KNode(first) || !isSiteLabel(site) {
		return "", false
	}
	return site, true
}

// isG5KNode checks <cluster>-<n>[suffixes]: the cluster is letters and
// digits starting with a letter, n is a decimal number.
func isG5KNode(label string) bool {
	parts := strings.Split(label, "-")
	if len(parts) < 2 || !isClusterName(parts[0]) || !isDigits(parts[1]) {
		return false
	}
	for rest := parts[2:]; len(rest) > 0; {
		switch p := rest[0]; {
		case p == "kavlan":
			if len(rest) < 2 || !isDigits(rest[1]) {
				return false
			}
			rest = rest[2:]
		case p == "ipv6" || isInterface(p):
			rest = rest[1:]
		default:
			return false
		}
	}
	return true
}

func isClusterName(s string) bool {
	if s == "" || !isLetter(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) {
			return false
		}
	}
	return true
}

// isInterface matches a network interface name: letters then a number
// (eth1, ib0, fpga0).
func isInterface(s string) bool {
	i := 0
	for i < len(s) && isLetter(s[i]) {
		i++
	}
	return i > 0 && isDigits(s[i:])
}

// isSiteLabel: Grid'5000 site names are words (nancy, lyon); the lab uses
// site1; a site starting with a digit would be confused with an address.
func isSiteLabel(s string) bool {
	return checkSiteName(s) == nil && isLetter(s[0]) && !strings.Contains(s, "_")
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
