package gateway

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// PortSet is the part of the destination policy an operator sets
// (--wan-allow-ports): TCP ports of this site's hosts that streams from
// other sites may reach whether or not a rank listens there (ranges,
// inclusive). By default it is empty: streams reach only the ports ranks
// registered (listeners.go), never a service of the site
// (docs/security.md).
type PortSet []PortRange

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi uint16 }

// DefaultAllowPorts is the policy of DefaultConfig: no port beyond the
// ranks' own.
var DefaultAllowPorts = PortSet{}

// DefaultListenPorts are the ports a LISTEN may register by default:
// Linux's default ephemeral range (net.ipv4.ip_local_port_range), where
// the kernel puts the listeners MPICH/UCX and Open MPI's runtime bind to
// port 0, and where the shim moves Open MPI's TCP BTL (which otherwise
// binds from 1024 up, among the services of the node). Services that
// users start on fixed ports sit below it.
var DefaultListenPorts = PortSet{{32768, 60999}}

// Has reports whether port p is allowed.
func (s PortSet) Has(p uint16) bool {
	for _, r := range s {
		if p >= r.Lo && p <= r.Hi {
			return true
		}
	}
	return false
}

// String writes the set as Set reads it.
func (s PortSet) String() string {
	if len(s) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, r := range s {
		if i > 0 {
			b.WriteByte(',')
		}
		if r.Lo == r.Hi {
			fmt.Fprintf(&b, "%d", r.Lo)
		} else {
			fmt.Fprintf(&b, "%d-%d", r.Lo, r.Hi)
		}
	}
	return b.String()
}

// ParsePortSet parses a comma-separated list of ports and ranges, e.g.
// "32768-60999,5201"; "any" is 1-65535, "none" the empty set.
func ParsePortSet(v string) (PortSet, error) {
	switch v {
	case "any":
		return PortSet{{1, 65535}}, nil
	case "none":
		return PortSet{}, nil
	}
	var s PortSet
	for _, f := range strings.Split(v, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(f), "-")
		a, err := parsePort(lo)
		if err != nil {
			return nil, fmt.Errorf("%q: %v: want ports and ranges like 32768-60999,5201 (or any, or none)", v, err)
		}
		b := a
		if isRange {
			if b, err = parsePort(hi); err != nil {
				return nil, fmt.Errorf("%q: %v: want ports and ranges like 32768-60999,5201 (or any, or none)", v, err)
			}
			if b < a {
				return nil, fmt.Errorf("%q: range %d-%d runs backwards", v, a, b)
			}
		}
		s = append(s, PortRange{a, b})
	}
	slices.SortFunc(s, func(x, y PortRange) int { return int(x.Lo) - int(y.Lo) })
	return s, nil
}

func parsePort(v string) (uint16, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("bad port %q (1-65535)", v)
	}
	return uint16(n), nil
}

// portFlag is a PortSet as a flag value.
type portFlag struct{ p *PortSet }

func (f portFlag) String() string { return f.p.String() }
func (f portFlag) Type() string   { return "ports" }
func (f portFlag) Set(v string) error {
	s, err := ParsePortSet(v)
	if err == nil {
		*f.p = s
	}
	return err
}

// metricsListen is where /metrics and /ready listen: an address without a
// host (":9105") means loopback, since the metrics name every peer and
// link of the site and need no network to be scraped locally; a host
// given (0.0.0.0:9105, the gateway's address) is taken as it is.
func metricsListen(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}
