package relay

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The poller thread's system calls bypass the runtime's syscall entry.
//
// A Go system call (syscall.Syscall) tells the scheduler the thread may
// block, and when the runtime's monitor thread (sysmon) is in its deep
// sleep, entering one wakes it: in a ping-pong through the gateway that
// was a sysmon wake-up every few round trips (3 kHz of its context
// switches, perf stat), each one more thread competing for the two vCPUs.
// The poller thread's calls never need the scheduler: the non-blocking
// reads and writes return at once, and while it waits in epoll_wait it
// holds a P of its own (getPoller adds one), so nothing waits for that P.
// They are made as raw system calls. A stop-the-world still gets the P:
// its preemption signal interrupts epoll_wait (EINTR) and the loop's next
// function call yields.

func rawEpollWait(ep int, evs []unix.EpollEvent, msec int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawEpollCtl(ep, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(ep), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func rawRead(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// rawWritev writes iov (at most 1024 slices, IOV_MAX) with one writev.
func rawWritev(fd int, iov [][]byte) (int, error) {
	var small [8]unix.Iovec
	v := small[:0]
	if len(iov) > len(small) {
		v = make([]unix.Iovec, 0, len(iov))
	}
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
		return 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}
