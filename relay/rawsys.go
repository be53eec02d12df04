package relay

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The poller thread's non-blocking calls bypass the runtime's syscall
// entry.
//
// A Go system call (syscall.Syscall) tells the scheduler the thread may
// block, and when the runtime's monitor thread (sysmon) is in its deep
// sleep, entering one wakes it. The poller thread's reads, writes and
// epoll_ctl calls never block (its sockets are non-blocking), so they are
// made as raw system calls: one Go system call per event (epoll_wait)
// instead of four. epoll_wait itself stays a Go system call, so its P
// serves goroutines while it waits: made raw, it removed sysmon's
// remaining wake-ups (2 kHz in the gateway pair's ping-pong) but, while
// the poller thread sat idle, made a ping-pong through Go's poller in the
// same process 2.4 times slower (93 -> 228 us; bench/figures/pollthread, 2026-11-24).

func rawEpollCtl(ep, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(ep), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func rawRead(fd int, b []byte) (int, error)  { return rawIO(unix.SYS_READ, fd, b) }
func rawWrite(fd int, b []byte) (int, error) { return rawIO(unix.SYS_WRITE, fd, b) }

// rawIO is read(2) or write(2).
func rawIO(trap uintptr, fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// rawWritev writes iov (at most 1024 slices, IOV_MAX) with one writev,
// building the iovecs in v (the caller's scratch, returned grown and
// cleared): a corked batch of frames (send.go) takes more iovecs than a
// stack array holds, and a new array per call would be an allocation per
// batch.
func rawWritev(fd int, iov [][]byte, v []unix.Iovec) (int, []unix.Iovec, error) {
	v = v[:0]
	for _, b := range iov {
		if len(b) == 0 {
			continue
		}
		var x unix.Iovec
		x.Base = &b[0]
		x.SetLen(len(b))
		v = append(v, x)
	}
	if len(v) == 0 {
		return 0, v, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
	clear(v) // pins no payload
	if e != 0 {
		return -1, v, e
	}
	return int(r), v, nil
}
