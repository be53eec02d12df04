package mx

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// fdTimer is the retransmission timer on Linux: a timerfd waited on in Go's
// poller. The poller's own timeout counts whole milliseconds
// (runtime/netpoll_epoll.go rounds a shorter wait up to 1 ms), so a
// time.AfterFunc due in 100 µs fires a millisecond late on an idle host,
// which is the host of a lost frame; an fd turning readable wakes the
// poller at once.
type fdTimer struct {
	fd   int
	f    *os.File
	done chan struct{}
}

// fdTimerSlack is how late the engine lets the timerfd fire. A kernel timer
// due before the CPU's next timer event reprograms the clock when armed
// and interrupts when it expires: on the 2-vCPU VM of bench/figures/mx a
// timerfd_settime 100 µs ahead costs 15 µs (10 ms ahead: 1.4 µs), and a
// timer armed at each frame's probe time and stopped at its
// acknowledgement made the 1-byte round trip 70 µs instead of 25. So the
// timer is neither re-armed per frame nor stopped on acknowledgements: it
// stays at the first deadline plus this slack and, when it fires, does
// what is due and moves on to the frames then in flight. While frames
// flow it fires about once per probe timeout plus slack; a lost frame's
// probe goes out at most this late.
const fdTimerSlack = 500 * time.Microsecond

func newFDTimer(fire func()) (retxTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	t := &fdTimer{fd: fd, f: os.NewFile(uintptr(fd), "mx-retx-timer"), done: make(chan struct{})}
	go t.loop(fire)
	return t, nil
}

func (t *fdTimer) loop(fire func()) {
	defer close(t.done)
	var b [8]byte // the expiry count
	for {
		if _, err := t.f.Read(b[:]); err != nil {
			return
		}
		fire()
	}
}

func (t *fdTimer) set(d time.Duration) {
	d = max(d, time.Microsecond) // a zero value would stop it
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	unix.TimerfdSettime(t.fd, 0, &spec, nil)
}

func (t *fdTimer) stop() { unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{}, nil) }

// close releases the fd once the engine will set it no more.
func (t *fdTimer) close() {
	t.f.Close()
	<-t.done
}
