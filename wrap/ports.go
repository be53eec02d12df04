package wrap

import (
	"math/rand/v2"
	"strings"
)

// Per-job gateways of two jobs on the same hosts must not share ports, so
// a port the user did not set is drawn for each job: the three ports of a
// gateway are one triple base, base+1, base+2 of the range below, so two
// jobs either use the same triple or share no port. A gateway that cannot
// bind (another job, or another program, holds the port) exits before it
// is ready; the wrapper then stops the job's gateways and draws again.
const (
	// PortsFrom..PortsTo is where ports are drawn: from the former fixed
	// defaults (5000-5002) up, below Linux's ephemeral range (32768-60999),
	// so no outgoing connection holds them. A firewall opens this range
	// between the sites.
	PortsFrom = 5000
	PortsTo   = 5999
	// portTries is how many draws a start gets before it gives up.
	portTries = 5
)

// ports is one job's gateway ports.
type ports struct{ lan, wan, metrics int }

// pickPorts fills the ports the user left 0 from a random triple, avoiding
// the ones the user set.
func pickPorts(r *rand.Rand, lan, wan, metrics int) ports {
	triples := (PortsTo - PortsFrom + 1) / 3
	for {
		base := PortsFrom + 3*r.IntN(triples)
		p := ports{lan, wan, metrics}
		for i, q := range []*int{&p.lan, &p.wan, &p.metrics} {
			if *q == 0 {
				*q = base + i
			}
		}
		if p.lan != p.wan && p.lan != p.metrics && p.wan != p.metrics {
			return p
		}
	}
}

// portTaken tells a gateway that exited because a port it wanted was in
// use, from the last lines of its log.
func portTaken(log string) bool { return strings.Contains(log, "address already in use") }
