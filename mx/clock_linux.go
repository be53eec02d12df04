package mx

import (
	"syscall"
	"time"
)

// shortTimer sleeps in clock_nanosleep, which wakes within microseconds of
// the deadline, on the calling goroutine's thread (the runtime hands the
// processor to other goroutines meanwhile).
func shortTimer(d time.Duration, f func()) Timer {
	t := &kernelTimer{}
	go func() {
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
		if t.done.CompareAndSwap(false, true) {
			f()
		}
	}()
	return t
}
