//go:build !linux

package mx

import "time"

// shortTimer is an ordinary timer where the poller's resolution is not
// known to be coarse.
func shortTimer(d time.Duration, f func()) Timer {
	t := &kernelTimer{}
	time.AfterFunc(d, func() {
		if t.done.CompareAndSwap(false, true) {
			f()
		}
	})
	return t
}
