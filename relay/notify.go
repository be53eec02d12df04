package relay

import "sync/atomic"

// ReadNotifier is implemented by an application connection that is not a
// kernel socket but says when it has bytes (an MX stream). Its out-stage
// then waits as a socket's does with the poller thread (stage.go): no
// goroutine and no buffer while the application is silent, the step run
// by the connection's callback when bytes arrive.
type ReadNotifier interface {
	// TryRead reads without waiting: 0 and no error when nothing has
	// arrived.
	TryRead(p []byte) (int, error)
	// Readable reports whether a read would not wait (bytes, end of
	// stream or an error are there).
	Readable() bool
	// NotifyReadable has f run whenever bytes, the end of the stream or
	// an error arrive; f must not block. nil: no more calls.
	NotifyReadable(f func())
}

// readWaiter is how the out-stage waits for its application's bytes
// without a goroutine: a socket's registration with the poller thread
// (waiter) or a ReadNotifier's callback (notifyWaiter).
type readWaiter interface {
	// read reads without blocking; errWouldBlock when nothing is there.
	read(b []byte) (int, error)
	// arm has the step run once the connection is readable; false: it
	// cannot, or it is readable already, and the owner reads itself.
	arm() bool
	// loud prepares an owner that blocks in the connection's Read.
	loud()
	// close ends the waiting once the stage is done with the connection.
	close()
}

// notifyWaiter waits for a ReadNotifier. The callback runs the out-stage's
// step (stage.readable) when the stage armed it, like the poller thread
// for a socket; the notifier's callbacks are edges, not levels, so whoever
// arms looks again for bytes that arrived meanwhile.
type notifyWaiter struct {
	c      ReadNotifier
	g      *stage
	armed  atomic.Bool
	closed atomic.Bool
}

func newNotifyWaiter(c ReadNotifier, g *stage) *notifyWaiter {
	w := &notifyWaiter{c: c, g: g}
	c.NotifyReadable(w.fire)
	return w
}

func (w *notifyWaiter) read(b []byte) (int, error) {
	n, err := w.c.TryRead(b)
	if n == 0 && err == nil {
		return 0, errWouldBlock
	}
	return n, err
}

func (w *notifyWaiter) arm() bool {
	if w.closed.Load() {
		return false
	}
	w.armed.Store(true)
	// Bytes that arrived since the read that found none fired nobody.
	if w.c.Readable() && w.armed.CompareAndSwap(true, false) {
		return false
	}
	return true
}

func (w *notifyWaiter) loud() {}

func (w *notifyWaiter) close() {
	w.closed.Store(true)
	w.armed.Store(false)
	w.c.NotifyReadable(nil)
}

// fire is the notifier's callback: it runs the step while the stage waits
// for bytes and they are there.
func (w *notifyWaiter) fire() {
	for w.armed.CompareAndSwap(true, false) {
		if !w.g.readable() || w.closed.Load() {
			return // the step went on elsewhere, or the stage is done
		}
		w.armed.Store(true) // the step waits for more
		if !w.c.Readable() {
			return
		}
	}
}
