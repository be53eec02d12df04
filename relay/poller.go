package relay

import (
	"errors"
	"io"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The poller thread: why a relay waits for its idle sockets in an event
// loop of its own.
//
// A gateway's latency is the sum of its wake-ups: a small message crosses
// a gateway when a socket becomes readable and some thread wakes to read it
// and write it on. With Go's network poller the woken goroutine runs on
// whichever thread the scheduler picks, and each wake-up after idleness
// involves two or three runtime threads (the poller, the goroutine's M, and
// sysmon, which the next system call wakes). On a VM each thread wake-up on
// an idle vCPU is a VM exit, and measured in bench/pingpong.sh a gateway
// pair as two processes cost more than a chain of two socat relays.
//
// So a stream or link that would block waiting for bytes hands its socket
// to one OS thread per process, which waits for all such sockets in
// epoll_wait and, when one becomes readable, runs that socket's step right
// there: read, frame, write to the next socket, wait again. A small message
// then costs one thread wake-up per gateway, as in a C event loop (once
// Go's runtime is kept from waking for the same bytes: rtquiet.go). The step
// never blocks (non-blocking reads and writes, short mutexes); anything it
// cannot finish without blocking (a frame larger than the reader's buffer,
// a read that fills a stream's buffer, end of file, an error) it hands to a
// worker goroutine that runs the same step with blocking reads (stage.go:
// a link's reader and a stream's out-stage are stages); a stream waiting
// for credit or a token waits for a kick, without a goroutine. A streaming socket keeps waiting in Go's
// poller (its bytes are due at once), so bulk payload never crosses the
// poller thread; the WINDOW frames coming back for it still wake the
// thread, which costs bulk forwarding about 10 % more CPU per byte.

// errWouldBlock is a non-blocking read or write that found nothing to do.
var errWouldBlock = errors.New("relay: would block")

type poller struct {
	ep   int
	tick int // timerfd: every schedEvery while busy, every sweepEvery while quiet
	// epf is a duplicate of ep (epDup) in Go's network poller, where the
	// thread waits while idle (nil, epDup -1: it stays in epoll_wait).
	// Its input is left out of the runtime's registration (epRT) while
	// the thread is not idle, or every event would wake the runtime too.
	epf   *os.File
	eprc  syscall.RawConn
	epDup int
	epRT  rtReg
	mu    sync.Mutex
	ws    map[uint32]*waiter
	next  uint32
	// cork: the thread runs the steps of a batch of several events, whose
	// small frames wait for its end (corks, flushed by flushCorks; send.go's
	// corking). The thread's alone.
	cork  bool
	corks []*Link
}

// tickID is the timer's epoll data; waiters' ids start at 1.
const tickID = 0

var thePoller struct {
	once sync.Once
	p    *poller
}

// getPoller starts the process's poller thread on first use; nil if epoll is
// unavailable (the relay then waits in Go's poller, as without it).
func getPoller() *poller {
	thePoller.once.Do(func() {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return
		}
		tick, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			unix.Close(ep)
			return
		}
		if unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, tick, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: tickID}) != nil {
			unix.Close(tick)
			unix.Close(ep)
			return
		}
		p := &poller{ep: ep, tick: tick, ws: make(map[uint32]*waiter), epDup: -1}
		p.watchEpoll()
		// The thread spends its life in epoll_wait holding a P in a system
		// call. One more P keeps it from taking one from the forwarding
		// goroutines, and while an idle P exists the runtime leaves the
		// blocked thread its P, so its wake-up needs no scheduler at all.
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
		go p.loop()
		thePoller.p = p
	})
	return thePoller.p
}

func (p *poller) loop() {
	runtime.LockOSThread() // one thread: the point of the poller
	evs := make([]unix.EpollEvent, 64)
	var buf [8]byte
	ticks, quiet := 0, 0 // quiet: fast ticks in a row without a step
	// fast: the tick runs every schedEvery; busy: some step ran since the
	// last tick; idle: waiting in Go's poller, the tick stopped. Neither
	// fast nor idle (no Go poller for the set): the tick runs every
	// sweepEvery.
	fast, busy, idle := false, false, false
	goIdle := func() {
		fast = false
		if p.eprc == nil {
			setTick(p.tick, sweepEvery)
			return
		}
		setTick(p.tick, 0) // waitIdle's deadline sweeps
		p.idle(true)
		idle = true
	}
	goIdle()
	for {
		var n int
		var err error
		if idle {
			n, err = p.waitIdle(evs)
			if err == os.ErrDeadlineExceeded {
				p.sweep()
				continue
			}
		} else {
			n, err = unix.EpollWait(p.ep, evs, -1)
		}
		if err != nil {
			continue // EINTR
		}
		ticked := false
		p.cork = n > 1
		for _, ev := range evs[:n] {
			if ev.Fd == tickID {
				rawRead(p.tick, buf[:]) // the expirations count; any is one tick
				ticked = true
				continue
			}
			p.mu.Lock()
			w := p.ws[uint32(ev.Fd)]
			p.mu.Unlock()
			if w != nil && w.fire() {
				busy = true
			}
		}
		p.cork = false
		p.flushCorks()
		if busy && !fast {
			if idle {
				p.idle(false)
				idle = false
			}
			setTick(p.tick, schedEvery)
			fast, ticks, quiet = true, 0, 0
		}
		if !ticked {
			continue
		}
		if !fast {
			p.sweep()
			continue
		}
		if ticks++; ticks%sweepTicks == 0 {
			p.sweep()
		}
		switch {
		case busy:
			runtime.Gosched()
			busy, quiet = false, 0
		case quiet+1 < lingerTicks:
			runtime.Gosched() // sysmon counts from the last pass, not the last step
			quiet++
		default:
			goIdle()
		}
	}
}

// flushCorks writes the frames the batch's steps corked, link by link.
func (p *poller) flushCorks() {
	for i, l := range p.corks {
		l.flushCork()
		p.corks[i] = nil
	}
	p.corks = p.corks[:0]
}

// setTick makes the timerfd tick every d from now on; 0 stops it.
func setTick(fd int, d time.Duration) error {
	every := unix.NsecToTimespec(int64(d))
	return unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: every, Value: every}, nil)
}

// While busy, the poller thread passes through Go's scheduler on each tick
// of a periodic timer, every schedEvery.
//
// sysmon preempts a goroutine that has run 10 ms without a pass through
// the scheduler (forcePreemptNS). The poller thread never passed one (it
// holds its P in epoll_wait and loops), so sysmon signalled it (SIGURG)
// and took its P, and each such retake reset sysmon to waking every 20 us
// for a millisecond before backing off. In the gateway pair's ping-pong
// that was 56 signals and 1,100 sysmon wake-ups a second per gateway, on
// the CPUs the ranks and the other gateway need; with the pass, no
// signal and 290 wake-ups. A runtime.Gosched on a locked thread costs a
// hand-off of the P to another thread and back, once per schedEvery.
// Figures in bench/figures/pollthread.
//
// The timer is a timerfd in the epoll set rather than epoll_wait's
// timeout: a timeout arms and cancels a kernel timer on every wait, that
// is at every message; without it the pair's CPU per round trip fell from
// 51.4 to 48.7 us. The periodic timer is re-armed only when the thread
// turns busy or idle.
//
// A thread that only waited in epoll_wait since the last tick has nothing
// for sysmon to preempt, so the first tick without a step slows the timer
// to sweepEvery, and the next step speeds it up again. An idle gateway
// (links up, no streams) woke 200 times a second for the tick alone, each
// a hand-off of the P to another thread and back: 1.9 % of a core per
// gateway, 1,070 wake-ups a second (BenchmarkIdleCPU, bench/figures/cpu).
const schedEvery = 5 * time.Millisecond

// sweepEvery is how often the poller looks for sockets closed under it.
// Closing a socket removes it from the epoll set without an event, so a
// socket closed by someone other than its stream or link (which cancel
// first) would leave its owner waiting; the sweep hands it back.
const sweepEvery = 100 * time.Millisecond

// sweepTicks is how many busy ticks apart the sweep runs.
const sweepTicks = int(sweepEvery / schedEvery)

// An idle poller thread waits in Go's network poller.
//
// A thread blocked in a Go system call keeps its P until sysmon takes it
// back (after 10 ms), and while some P is not idle sysmon does not sleep:
// every time the thread woke (a tick, a keepalive) sysmon polled every
// 20 us for a millisecond, then backed off over the next 10 ms, and each
// retake of the thread's P started that over: 300 wake-ups a second in an
// idle gateway, 0.6 % of a core. So once no step has run for a while the
// thread stops the timer and waits for the epoll set to become readable
// in Go's poller, holding no P, and sysmon sleeps; the sweep runs on the
// wait's deadline. The first event after that costs one more thread
// wake-up (Go's poller hands the locked goroutine to its thread), and
// sysmon, woken from its sleep, polls every 20 us again for a millisecond
// and backs off over the next 10: a ping-pong with 20 ms between round
// trips that idled at the first quiet tick cost the pair 2.3 ms of CPU
// per round trip instead of 0.85. So the thread lingers, ticking, for
// lingerTicks quiet ticks before it idles: messages a WAN round trip
// apart keep it busy. A step that moved nothing but keepalives (PING, PONG,
// ACK) neither wakes it from idle nor extends its linger: on an idle
// gateway each keepalive had cost a 50 ms linger, ten ticks each with a
// hand-off of the P and a burst of sysmon polling.

// lingerTicks is how many ticks without a step (50 ms) the thread waits
// before it idles.
const lingerTicks = int(50 * time.Millisecond / schedEvery)

// watchEpoll registers the epoll set with Go's network poller, so the
// thread can wait there while idle; on failure it stays in epoll_wait.
func (p *poller) watchEpoll() {
	fd, err := unix.Dup(p.ep)
	if err != nil {
		return
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return
	}
	f := os.NewFile(uintptr(fd), "poller-epoll")
	if f.SetReadDeadline(time.Time{}) != nil { // not in Go's poller
		f.Close()
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return
	}
	p.epf, p.eprc, p.epDup = f, rc, fd
	p.idle(false)
	if !p.epRT.ok { // the runtime would wake for every event: do without
		p.epf, p.eprc, p.epDup = nil, nil, -1
		f.Close()
	}
}

// idle tells the runtime about the epoll set's input (on) or not (off).
func (p *poller) idle(on bool) {
	p.eprc.Control(func(fd uintptr) { p.epRT.quiet(p, int(fd), !on) })
}

// waitIdle waits in Go's network poller until the epoll set has events,
// and collects them without blocking; os.ErrDeadlineExceeded after
// sweepEvery without any.
func (p *poller) waitIdle(evs []unix.EpollEvent) (n int, err error) {
	p.epf.SetReadDeadline(time.Now().Add(OnGrid(sweepEvery)))
	rerr := p.eprc.Read(func(fd uintptr) bool {
		n, err = unix.EpollWait(int(fd), evs, 0)
		return n > 0 || (err != nil && err != unix.EINTR)
	})
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		return 0, os.ErrDeadlineExceeded
	}
	return n, err
}

func (p *poller) sweep() {
	p.mu.Lock()
	ws := make([]*waiter, 0, len(p.ws))
	for _, w := range p.ws {
		ws = append(ws, w)
	}
	p.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		gone := w.armed && w.rc.Control(func(uintptr) {}) != nil
		if gone {
			w.armed, w.added = false, false // left the epoll set with its file
		}
		w.mu.Unlock()
		if gone {
			w.handBack()
		}
	}
}

// A waiter is one socket's registration. Its owner, a stage (a link's
// reader, a stream's out-stage: stage.go), owns the socket except between
// arming it and the hand-back, when the poller thread does.
type waiter struct {
	p  *poller
	id uint32
	rc syscall.RawConn
	// g's step runs on the poller thread when the socket is readable
	// (stage.readable); g is kicked when the poller loses the socket
	// (closed under it), since no readiness event will come for it.
	g  *stage
	mu sync.Mutex
	// armed: the poller thread owns the socket and runs its step on the
	// next readiness event. added: in the epoll set.
	// cancelled: the socket is closing; never arm again.
	armed, added, cancelled bool
	rt                      rtReg // the runtime's registration (rtquiet.go); only the owner touches it
	rtQuiet                 bool  // the runtime is kept from the socket's input now

	// The callbacks handed to RawConn and their arguments and results,
	// made once: a closure per call would escape (RawConn is an interface)
	// and cost the poller thread a few allocations for every message.
	rfn, wfn func(uintptr) bool
	rb       []byte // read: the owner's
	rn       int
	rerr     error
	wiov     [][]byte // writev: the current writer's
	wv       []unix.Iovec
	wn       int
	werr     error
	cfn      func(uintptr) // ctl: under mu
	cop      int
	cev      unix.EpollEvent
	cerr     error
}

// newWaiter registers c (which must expose its file descriptor) with the
// process's poller for stage g: g arms the socket and the poller runs g's
// step on readiness. nil when there is no poller or c is not a socket.
// quiet: keep the runtime from waking for the socket's input while the
// poller owns it (rtquiet.go).
func newWaiter(c any, g *stage, quiet bool) *waiter {
	sc, ok := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := getPoller()
	if p == nil {
		return nil
	}
	w := &waiter{p: p, rc: rc, g: g}
	w.rfn = func(fd uintptr) bool {
		for {
			w.rn, w.rerr = rawRead(int(fd), w.rb)
			if w.rerr != unix.EINTR {
				return true
			}
		}
	}
	w.wfn = func(fd uintptr) bool {
		for {
			w.wn, w.wv, w.werr = rawWritev(int(fd), w.wiov, w.wv)
			if w.werr != unix.EINTR {
				return true
			}
		}
	}
	w.cfn = func(fd uintptr) { w.cerr = rawEpollCtl(w.p.ep, w.cop, int(fd), &w.cev) }
	w.rt.looked = !quiet // never look it up: leave the runtime as it is
	p.mu.Lock()
	if p.next++; p.next == tickID { // wrapped: the timer's
		p.next++
	}
	w.id = p.next
	p.ws[w.id] = w
	p.mu.Unlock()
	return w
}

// ctl changes the registration while holding Go's reference to the
// descriptor, so a concurrent Close cannot let its number be reused under
// us. A closed socket has left the epoll set with its last reference.
//
// The registration is level-triggered and stays while the poller thread
// keeps the socket: a step that waits for more bytes then costs no system
// call, where re-arming a one-shot registration cost an epoll_ctl per
// message at each gateway. Handing the socket back removes it (a
// registration without events would still report a hang-up, again and
// again).
func (w *waiter) ctl(op int) error {
	w.cop, w.cev = op, unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(w.id)}
	if err := w.rc.Control(w.cfn); err != nil {
		return err
	}
	err := w.cerr
	w.cerr = nil
	return err
}

// arm gives the socket to the poller thread, which runs the step when it
// becomes readable; false when it cannot be armed (closing, or epoll
// refused it) and the owner should read it itself. Only the owner arms.
func (w *waiter) arm() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancelled {
		return false
	}
	// Quiet the runtime before arming, so bytes arriving right after do
	// not wake it; the owner makes it loud again before it waits in Go's
	// poller (loud).
	if !w.rtQuiet {
		w.quietRuntime(true)
		w.rtQuiet = true
	}
	w.armed = true
	if !w.added {
		if err := w.ctl(unix.EPOLL_CTL_ADD); err != nil {
			w.armed = false
			return false
		}
		w.added = true
	}
	return true
}

// loud gives the socket's input back to the runtime, for an owner about
// to wait in Go's poller.
func (w *waiter) loud() {
	if w != nil && w.rtQuiet {
		w.quietRuntime(false)
		w.rtQuiet = false
	}
}

// handBack returns the socket to its stage after the poller let it go
// without the step's say (a socket closed under it).
func (w *waiter) handBack() { w.g.kick() }

// fire runs the step for one readiness event, then waits again or hands
// the socket back.
func (w *waiter) fire() (traffic bool) {
	w.mu.Lock()
	if !w.armed { // cancelled meanwhile: the event is stale
		w.mu.Unlock()
		return false
	}
	w.armed = false
	w.mu.Unlock()
	var t0 uint64
	if w.g.traffic != nil {
		t0 = w.g.traffic.Load()
	}
	more := w.g.readable()
	// A step handed to a worker goes on there: count it as traffic.
	st := w.g.state.Load()
	traffic = w.g.traffic == nil || w.g.traffic.Load() != t0 || !more && st != stageDone && st != stageIdle
	w.mu.Lock()
	switch {
	case w.cancelled:
		w.armed = false
		w.remove()
	case more:
		w.armed = true // still registered: nothing to do
	case w.armed:
		// The step handed over to a goroutine, which armed the socket
		// again already.
	default:
		w.remove()
	}
	w.mu.Unlock()
	return traffic
}

// remove takes the socket out of the epoll set; under mu.
func (w *waiter) remove() {
	if w.added {
		w.ctl(unix.EPOLL_CTL_DEL)
		w.added = false
	}
}

// cancel takes the socket back from the poller before it is closed, and
// keeps it from being armed again. Any goroutine may call it. The stage is
// not kicked: one that must see the close (a link's reader) is kicked by
// its closer once the socket is closed, when its step cannot wait again.
func (w *waiter) cancel() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.cancelled = true
	if w.armed {
		w.armed = false
		w.remove()
	}
	w.mu.Unlock()
}

// close unregisters the waiter once its stage is done with the socket.
func (w *waiter) close() {
	if w == nil {
		return
	}
	w.cancel()
	w.mu.Lock()
	w.remove()
	w.mu.Unlock()
	w.p.mu.Lock()
	delete(w.p.ws, w.id)
	w.p.mu.Unlock()
}

// read makes one non-blocking read(2) (Go's sockets are O_NONBLOCK; the
// callback never asks Go's poller to wait). Only the socket's owner reads.
func (w *waiter) read(b []byte) (int, error) {
	w.rb = b
	err := w.rc.Read(w.rfn)
	n, rerr := w.rn, w.rerr
	w.rb, w.rerr = nil, nil
	if err != nil {
		return 0, err
	}
	switch {
	case rerr == unix.EAGAIN:
		return 0, errWouldBlock
	case rerr != nil:
		return 0, rerr
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// writev makes one non-blocking writev(2); (0, nil) when the socket's
// buffer is full. One writer at a time (the link's writing flag).
func (w *waiter) writev(iov [][]byte) (int, error) {
	w.wiov = iov
	err := w.rc.Write(w.wfn)
	n, werr := w.wn, w.werr
	w.wiov, w.werr = nil, nil
	if err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		return 0, nil
	}
	return max(n, 0), werr
}
