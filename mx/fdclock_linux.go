package mx

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// fdClock is the engine's real clock on Linux: its one timer is a timerfd
// waited on in Go's poller. The poller's own timeout is in whole
// milliseconds (runtime/netpoll_epoll.go rounds a shorter wait up to 1 ms),
// but an fd turning readable wakes it at once, so the engine's 20-200 us
// timers fire on time without a thread parked per timer.
type fdClock struct {
	fd   int
	f    *os.File
	mu   sync.Mutex
	fn   func()
	gen  uint64
	done chan struct{}
}

func newFDClock() (*fdClock, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	c := &fdClock{fd: fd, f: os.NewFile(uintptr(fd), "mx-timer"), done: make(chan struct{})}
	go c.loop()
	return c, nil
}

func (c *fdClock) Now() time.Time { return time.Now() }

func (c *fdClock) loop() {
	defer close(c.done)
	var b [8]byte
	for {
		if _, err := c.f.Read(b[:]); err != nil {
			return
		}
		c.mu.Lock()
		f := c.fn
		c.fn = nil
		c.mu.Unlock()
		if f != nil {
			f()
		}
	}
}

// AfterFunc replaces the pending function: the engine keeps one timer.
func (c *fdClock) AfterFunc(d time.Duration, f func()) Timer {
	d = max(d, time.Microsecond) // a zero value would disarm
	c.mu.Lock()
	c.fn = f
	c.gen++
	t := &fdTimer{c: c, gen: c.gen}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	unix.TimerfdSettime(c.fd, 0, &spec, nil)
	c.mu.Unlock()
	return t
}

type fdTimer struct {
	c   *fdClock
	gen uint64
}

func (t *fdTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != t.gen || c.fn == nil {
		return false
	}
	c.fn = nil
	unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{}, nil)
	return true
}

func (c *fdClock) Close() error {
	err := c.f.Close()
	<-c.done
	return err
}
