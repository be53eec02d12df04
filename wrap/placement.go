package wrap

import (
	"fmt"
	"strings"
)

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
