package relay

// How a stage runs its step (the stages: a link's reader, a stream's
// out-stage and in-stage):
//
//  1. kick: whoever provides what the step waits for (a token, credit,
//     queued data) kicks the stage; readable, when the poller thread finds
//     the socket it waits for readable, runs the step right there;
//  2. dispatch, work: a worker goroutine takes the stage;
//  3. run: the step, until it returns what it waits for (waitOn);
//  4. park: the stage idles, holding no goroutine, unless it was kicked
//     meanwhile, and then it runs again.

import (
	"sync"
	"sync/atomic"
)

// Stages: each step of the data path, written once.
//
// A link's reader (recv.go) is a stage: it reads frames on the poller
// thread while the link is idle and on a worker goroutine otherwise.
//
// A stream moves bytes in two stages: the out-stage (application -> link:
// read the application's socket, frame, send) and the in-stage (link ->
// application: write the receive queue to the socket, return credit).
// Each is one step function that runs until it would block and then
// returns what it waits for:
//
//   - onSignal: a pipeline token, credit or queued data. The step records
//     that it waits (under the stream's mutex) and whoever changes that
//     state kicks the stage.
//   - onReadable: the application's socket to become readable. The socket
//     is registered with the poller thread (waiter.arm), which runs the
//     step right there when bytes arrive.
//   - onGoroutine: (on the poller thread only) the rest may block: a large
//     read of a streaming application, end of file or an error. A
//     goroutine runs the step from there.
//   - finished: the stage is over.
//
// The stage runs its step on at most one goroutine or the poller thread at
// a time. A waiting stage holds no goroutine: a kick hands it to a worker
// goroutine, which runs the step until it waits again and then waits for
// the next stage to run (see workers). So an idle stream costs its
// structures and its socket's registration, not two parked goroutine
// stacks. Without the poller thread (Config.NoPoller, or an application
// connection that is not a kernel socket) the out-step never returns
// onReadable: it reads with Go's blocking Read on its worker, and Go's
// poller waits for the socket.

// waitOn is what a stage's step stopped for.
type waitOn uint8

const (
	onSignal waitOn = iota
	onReadable
	onGoroutine
	finished
)

// A stage's state: idle (waiting, no runner), running (one runner owns
// the step), again (running, and kicked meanwhile: what it waits for may
// be ready, so it must look again before it waits), done.
const (
	stageIdle int32 = iota
	stageRunning
	stageAgain
	stageDone
)

// stage runs one step function as described above.
type stage struct {
	state atomic.Int32
	step  func(onPoller bool) waitOn
	// traffic, when set, counts what the stage moved other than its
	// link's upkeep (keepalives): a step that left it unchanged does not
	// keep the poller thread lingering (poller.loop). Nil: every step is
	// traffic (a stream's).
	traffic *atomic.Uint64
}

// kick says that what the stage waits for may be ready: an idle stage gets
// a goroutine; a running one runs its step again before it waits.
func (g *stage) kick() {
	for {
		switch g.state.Load() {
		case stageIdle:
			if g.state.CompareAndSwap(stageIdle, stageRunning) {
				dispatch(g)
				return
			}
		case stageRunning:
			if g.state.CompareAndSwap(stageRunning, stageAgain) {
				return
			}
		default: // kicked already, or over
			return
		}
	}
}

// park gives the stage up after a step that waits. False: it was kicked
// while the step ran, and the runner must step again.
func (g *stage) park() bool {
	if g.state.CompareAndSwap(stageRunning, stageIdle) {
		return true
	}
	g.state.Store(stageRunning) // from stageAgain; only the owner leaves it
	return false
}

// run is a goroutine's turn at the stage.
func (g *stage) run() {
	for {
		switch g.step(false) {
		case finished:
			g.state.Store(stageDone)
			return
		case onGoroutine: // already on one
			continue
		}
		if g.park() {
			return
		}
	}
}

// readable is the waiter's step: it runs the stage's step on the poller
// thread when the socket it waits for is readable, and reports whether the
// poller keeps waiting for it. A stage already running elsewhere is kicked
// instead: its runner reads the socket.
func (g *stage) readable() bool {
	if !g.state.CompareAndSwap(stageIdle, stageRunning) {
		g.kick()
		return false
	}
	for {
		switch g.step(true) {
		case finished:
			g.state.Store(stageDone)
			return false
		case onGoroutine:
			dispatch(g) // the stage stays running: the worker owns it now
			return false
		case onReadable:
			if g.park() {
				return true
			}
		case onSignal:
			if g.park() {
				return false
			}
		}
	}
}

// Workers: the goroutines that run stages' steps.
//
// A stage that waits gives up its goroutine, and a stream carrying bulk
// waits often (for a pipeline token at every chunk the link writer has
// not taken yet, for queued data at every chunk the in-stage has written).
// A new goroutine for each of those runs would start on a small stack and
// grow it again on its first write; so a worker that has run a stage
// waits for the next one, LIFO (the most recently used stack first), and
// a kick hands the stage to it as a channel send, which costs what waking
// a parked pump goroutine did. At most maxIdleWorkers wait at once: a
// burst of streams may start more workers, and those beyond the bound
// exit when their stage waits. The bound is per process, not per stream.
const maxIdleWorkers = 64

var workers struct {
	mu   sync.Mutex
	idle []chan *stage
}

// dispatch runs g (which the caller has marked running) on a worker.
func dispatch(g *stage) {
	workers.mu.Lock()
	if n := len(workers.idle); n > 0 {
		c := workers.idle[n-1]
		workers.idle = workers.idle[:n-1]
		workers.mu.Unlock()
		c <- g
		return
	}
	workers.mu.Unlock()
	go work(g)
}

// work runs stages, starting with g, until the pool of idle workers is full.
func work(g *stage) {
	c := make(chan *stage, 1)
	for {
		g.run()
		workers.mu.Lock()
		if len(workers.idle) >= maxIdleWorkers {
			workers.mu.Unlock()
			return
		}
		workers.idle = append(workers.idle, c)
		workers.mu.Unlock()
		g = <-c
	}
}
