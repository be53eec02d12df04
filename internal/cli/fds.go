package cli

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInheritedOnExec marks every descriptor above stderr that the process
// inherited close-on-exec, so the daemons a command starts (the lab's
// emulator, gateways, competing flows) hold none of its launcher's
// descriptors: a `flock LOCK mpi5k lab up` would otherwise leave the lock
// held by the emulator for the lab's life, and an inherited pipe would
// keep the launcher's reader from ever seeing end of file. Descriptors the
// Go runtime opens are close-on-exec already.
func CloseInheritedOnExec() error {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd <= 2 {
			continue
		}
		unix.CloseOnExec(fd) // the directory's own descriptor is closed: EBADF, ignored
	}
	return nil
}
