package relay

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Keeping Go's runtime asleep while the poller thread owns a socket.
//
// Every socket made through package net is also in the runtime's own epoll
// set, registered edge-triggered for input and output. A gateway always has
// a timer pending and goroutines waiting in Accept, so one runtime thread
// sleeps in that set, and every byte that reaches a socket the poller
// thread is waiting for wakes that thread too: it finds no goroutine to
// run and sleeps again. On a VM that is one more vCPU wake-up per hop:
// measured with bench/pingpong.sh it cost the gateway pair 6-16 us per
// round trip with idle vCPUs polling and usually 16-49 us with them
// halting (bench/figures/pollthread).
//
// So while the poller thread owns a socket, the runtime's registration of
// it is modified to leave out input (EPOLLIN, EPOLLRDHUP, EPOLLPRI), and it
// is put back exactly as it was before the socket's owner waits in the
// runtime again (waiter.loud). Nothing is lost: only the owner reads the
// socket, and it waits on the poller, not in the runtime, until then; a writer
// parked in the runtime still gets its EPOLLOUT (kept), errors and hang-ups
// are always reported, and restoring the registration makes the kernel
// report input already there. The runtime only ever adds and deletes its
// registrations, so modifying one in between is invisible to it; a socket
// closed meanwhile has no registration left, and the change fails
// harmlessly. The runtime's registration (its event mask and the opaque
// word naming its poll descriptor) is read from /proc/self/fdinfo; where
// it cannot be found unambiguously the socket is left as it is.

// rtInput is what the runtime is not told about while the poller owns a
// socket.
const rtInput = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLPRI

// rtReg is the runtime's epoll registration of one socket.
type rtReg struct {
	looked bool // looked it up (once per waiter), or was told not to
	ok     bool // found: ep and ev are valid
	ep     int
	ev     unix.EpollEvent
}

// quietRuntime leaves input out of the runtime's registration of the waiter's
// socket (on) or restores it (off).
func (w *waiter) quietRuntime(on bool) {
	w.rc.Control(func(fd uintptr) { w.rt.quiet(w.p, int(fd), on) })
}

// quiet leaves input out of the runtime's registration of fd (on) or
// restores it (off).
func (r *rtReg) quiet(p *poller, fd int, on bool) {
	if !r.looked {
		r.looked = true
		r.ep, r.ev, r.ok = runtimeRegistration(p, fd)
	}
	if !r.ok {
		return
	}
	ev := r.ev
	if on {
		ev.Events &^= rtInput
	}
	// ENOENT: the socket is being closed and the runtime has dropped it.
	rawEpollCtl(r.ep, unix.EPOLL_CTL_MOD, fd, &ev)
}

// rtTable is what the runtime's epoll set held when last read: one entry
// per socket, by descriptor. Reading a set's fdinfo costs time in
// proportion to its size (every socket of the process), so one reading
// serves every socket it lists and the set is read again only for a socket
// the table does not know: a thousand streams opening at once need a few
// readings, not a thousand.
type rtTable struct {
	mu      sync.Mutex
	looked  bool  // sets is known
	sets    []int // this process's epoll descriptors other than the poller's
	entries map[int]rtEntry
	buf     []byte
}

type rtEntry struct {
	ino uint64
	ep  int
	ev  unix.EpollEvent
	n   int // how many sets hold the descriptor: only one in exactly one is touched
}

var theRTTable rtTable

// runtimeRegistration returns the runtime's registration of fd: the one
// epoll set other than mine that holds it, edge-triggered and for input,
// as Go's runtime registers sockets. The poller's own descriptors of its
// set are not the runtime's.
func runtimeRegistration(p *poller, fd int) (int, unix.EpollEvent, bool) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0, unix.EpollEvent{}, false
	}
	t := &theRTTable
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.looked {
		// The runtime's set is made with the process's first socket,
		// before any relay waits.
		t.looked = true
		t.sets = epollSets(p.ep, p.epDup)
	}
	e, ok := t.entries[fd]
	if !ok || e.ino != st.Ino {
		t.read()
		e, ok = t.entries[fd]
	}
	if !ok || e.ino != st.Ino || e.n != 1 || e.ev.Events&unix.EPOLLET == 0 || e.ev.Events&unix.EPOLLIN == 0 {
		return 0, unix.EpollEvent{}, false
	}
	return e.ep, e.ev, true
}

// epollSets lists this process's epoll descriptors other than mine.
func epollSets(mine ...int) []int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var sets []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(mine, n) {
			continue
		}
		if t, _ := os.Readlink("/proc/self/fd/" + e.Name()); t == "anon_inode:[eventpoll]" {
			sets = append(sets, n)
		}
	}
	return sets
}

// read rebuilds the table from the sets' fdinfo, whose entries are lines
// "tfd: FD events: HEX data: HEX pos:N ino:HEX sdev:HEX" (proc(5)).
func (t *rtTable) read() {
	t.entries = make(map[int]rtEntry, len(t.entries))
	for _, ep := range t.sets {
		b, err := readAll(fmt.Sprintf("/proc/self/fdinfo/%d", ep), t.buf[:0])
		t.buf = b[:0]
		if err != nil {
			continue
		}
		for len(b) > 0 {
			line := b
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				line, b = b[:i], b[i+1:]
			} else {
				b = nil
			}
			fd, events, data, ino, ok := parseEpollEntry(line)
			if !ok {
				continue
			}
			e := t.entries[fd]
			e.n++
			e.ino, e.ep = ino, ep
			e.ev = unix.EpollEvent{Events: events, Fd: int32(uint32(data)), Pad: int32(uint32(data >> 32))}
			t.entries[fd] = e
		}
	}
}

// readAll reads a proc file into buf.
func readAll(name string, buf []byte) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// parseEpollEntry parses one "tfd:" line of an epoll descriptor's fdinfo.
func parseEpollEntry(line []byte) (fd int, events uint32, data, ino uint64, ok bool) {
	fs := strings.Fields(string(line))
	if len(fs) < 7 || fs[0] != "tfd:" || fs[2] != "events:" || fs[4] != "data:" {
		return 0, 0, 0, 0, false
	}
	fd, err := strconv.Atoi(fs[1])
	if err != nil {
		return 0, 0, 0, 0, false
	}
	ev, err := strconv.ParseUint(fs[3], 16, 32)
	if err != nil {
		return 0, 0, 0, 0, false
	}
	if data, err = strconv.ParseUint(fs[5], 16, 64); err != nil {
		return 0, 0, 0, 0, false
	}
	for _, x := range fs[6:] {
		if v, found := strings.CutPrefix(x, "ino:"); found {
			if ino, err = strconv.ParseUint(v, 16, 64); err == nil {
				return fd, uint32(ev), data, ino, true
			}
		}
	}
	return 0, 0, 0, 0, false
}
