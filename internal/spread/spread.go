// Package spread orders a site's gateway hosts for a new connection, for
// the shim (kernel TCP to the gateways) and the MX node daemon alike.
//
// Each new connection goes to the next gateway in turn, starting at a
// random one, so processes that each open few connections still spread.
// Round robin rather than a hash of the connection's 4-tuple: the source
// port is the kernel's choice at connect, after the gateway is chosen, and
// a hash of the destination alone would put every connection of a rank
// pair on one gateway. A gateway whose last attempt failed goes to the end
// of the order for RetryAfter, so a host that is down costs new
// connections nothing while another answers.
package spread

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// RetryAfter is how long a gateway whose attempt failed goes last.
const RetryAfter = 5 * time.Second

// Order is the round robin over a site's gateways (at most
// sitemap.MaxGateways) and when each last failed. The zero value is
// ready; it is safe for concurrent use.
type Order struct {
	once   sync.Once
	next   atomic.Uint32
	failed [sitemap.MaxGateways]atomic.Int64 // unix ns of gateway i's last failure
}

// Next returns the order in which a new connection tries n gateways:
// round robin from a random start, those that failed in the last
// RetryAfter moved to the end.
func (o *Order) Next(n int) []int {
	o.once.Do(func() { o.next.Store(rand.Uint32()) })
	start := int(o.next.Add(1) % uint32(n))
	now := time.Now().UnixNano()
	order := make([]int, 0, n)
	var failed []int
	for k := range n {
		i := (start + k) % n
		if now-o.failed[i].Load() < int64(RetryAfter) {
			failed = append(failed, i)
			continue
		}
		order = append(order, i)
	}
	return append(order, failed...)
}

// Failed puts gateway i last for RetryAfter.
func (o *Order) Failed(i int) { o.failed[i].Store(time.Now().UnixNano()) }

// Succeeded takes gateway i back into the round robin at once.
func (o *Order) Succeeded(i int) { o.failed[i].Store(0) }
