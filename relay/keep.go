package relay

import (
	"fmt"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// Keepalives of all links with the same PingInterval run on one timer.
//
// A goroutine and a timer per link woke an idle hub with 254 peers 508
// times a second, and each PING cost four frames at the hub (its PING,
// the peer's PONG, the peer's PING, its PONG). Now one goroutine per
// period walks the links, and an idle link (no frame but keepalives since
// the last tick: keepalive) pings only when it has heard nothing for a while:
//
//   - the trunk's dialer when silent for idlePing(cfg) - PingInterval,
//   - the acceptor when silent for idlePing(cfg) + PingInterval/2,
//
// so on an idle link only the dialer pings, about every idlePing, and the
// acceptor hears its PINGs and the dialer the PONGs: each side hears the
// other well within DeadAfter. If the dialer stops pinging (an older peer,
// or a peer with a longer period), the acceptor pings on its own. A busy
// link pings every PingInterval as before (its RTT samples). An idle
// link with no streams whose peer has feature QUIET sends no keepalive at
// all: the kernel's TCP keepalive watches it (quiet.go).

// idlePing is the longest an idle link waits, silent, before it pings: a
// third of DeadAfter, so a dead peer is still found after DeadAfter.
func idlePing(cfg *Config) time.Duration {
	return max(cfg.PingInterval, cfg.DeadAfter/3)
}

type keeper struct {
	period time.Duration
	mu     sync.Mutex
	links  map[*Link]struct{}
}

var keepers struct {
	mu sync.Mutex
	m  map[time.Duration]*keeper
}

// keep adds l to the keeper of its period, starting one if none runs.
func keep(l *Link) {
	p := l.cfg.PingInterval
	keepers.mu.Lock()
	defer keepers.mu.Unlock()
	if keepers.m == nil {
		keepers.m = map[time.Duration]*keeper{}
	}
	k := keepers.m[p]
	if k == nil {
		k = &keeper{period: p, links: map[*Link]struct{}{}}
		keepers.m[p] = k
		go k.run()
	}
	k.mu.Lock()
	k.links[l] = struct{}{}
	k.mu.Unlock()
}

func (k *keeper) run() {
	// Ticks are PingInterval apart on the grid: rounding each wait up from
	// when the last tick ran would add a grid slot to every period.
	next := time.Now().Add(OnGrid(k.period))
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	var links []*Link
	// steady is since when the ticks have come on time. A keeper that ran
	// late sent no PINGs meanwhile, so no PONGs came back either: silence
	// counts from there, or a starved process would take every link for
	// dead at once.
	steady, prev := time.Now(), time.Now()
	for now := range t.C {
		if now.Sub(prev) > 2*k.period {
			steady = now
		}
		prev = now
		links = links[:0]
		k.mu.Lock()
		for l := range k.links {
			links = append(links, l)
		}
		k.mu.Unlock()
		for _, l := range links {
			if !l.keepTick(now, steady) {
				k.mu.Lock()
				delete(k.links, l)
				k.mu.Unlock()
			}
		}
		clear(links)
		keepers.mu.Lock()
		k.mu.Lock()
		empty := len(k.links) == 0
		k.mu.Unlock()
		if empty { // keep starts another with the next link
			delete(keepers.m, k.period)
			keepers.mu.Unlock()
			return
		}
		keepers.mu.Unlock()
		if next = next.Add(k.period); time.Until(next) <= 0 { // late: skip ahead
			next = time.Now().Add(OnGrid(k.period))
		}
		t.Reset(time.Until(next))
	}
}

// keepalive reports whether frames of type t are the link's own upkeep:
// they alone do not make a link busy. An ACK is one: a link that resumes
// acknowledges received PINGs and PONGs too.
func keepalive(t header.Type) bool {
	return t == header.TypePing || t == header.TypePong || t == header.TypeAck
}

// keepTick is one keepalive tick of l; false once l has ended. Silence
// counts from steady at the earliest (see keeper.run). What may
// block or take long (failing a link, breaking its connection) runs on a
// goroutine of its own, so one link does not delay the others' ticks.
func (l *Link) keepTick(now, steady time.Time) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	l.mu.Lock()
	gen, broken := l.gen, l.broken
	var downAt time.Time
	if broken {
		downAt = l.rs.downAt
	}
	l.mu.Unlock()
	if broken {
		if d := now.Sub(downAt); d > l.rs.within {
			go l.fail(fmt.Errorf("relay: link %d to %s down for %v without resuming (limit %v)", l.index, l.peer.Name, d.Round(time.Millisecond), l.rs.within))
			return false
		}
		return true
	}
	active := l.active.Load()
	busy := active != l.keptActive
	l.keptActive = active
	if l.keepQuiet(now, busy) {
		return true // the kernel watches the link (quiet.go)
	}
	silent := now.Sub(time.Unix(0, max(l.lastRecv.Load(), l.wokeAt)))
	if d := now.Sub(steady); silent > l.cfg.DeadAfter && d > l.cfg.DeadAfter {
		go l.broke(gen, fmt.Errorf("%w for %v (from %v)", errSilent, silent.Round(time.Millisecond), l.remoteAddr()))
		return true
	}
	if l.rs != nil {
		l.tickAck(now) // in the PING's write, if there is one
	}
	if !busy {
		wait := idlePing(&l.cfg) + l.cfg.PingInterval/2 // clear of the dialer's, with timer jitter
		if l.t.dialer {
			wait = idlePing(&l.cfg) - l.cfg.PingInterval
		}
		if silent < wait {
			return true
		}
	}
	f := frame{h: header.Header{Type: header.TypePing, Length: 8}}
	header.PutU32(f.ctl[:4], uint32(uint64(now.UnixNano())>>32))
	header.PutU32(f.ctl[4:], uint32(now.UnixNano()))
	l.enqueue(f, nil)
	return true
}
