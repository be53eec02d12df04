package testbed

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// openAny loads a lab's state even while it is still coming up (Enter is
// used by Up's own checks).
func openAny(name string) (*Lab, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(labDir(name), "lab.json"))
	if err != nil {
		return nil, fmt.Errorf("lab %q is not up: %w", name, err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("lab %q: corrupt state: %w", name, err)
	}
	return newLab(st), nil
}

// Enter replaces the calling process with argv run inside a lab host: it
// joins the host's network and UTS namespaces, makes a private mount
// namespace with the lab's hosts file over /etc/hosts and a sysfs of the
// host's network namespace (as `ip netns exec` does), then execs. It only
// returns on error. It must run in a fresh process (bin/mpi5k lab _enter or
// _ssh): namespaces are per thread, so all of it happens on one locked
// thread which then calls execve, and the new program starts with exactly
// that thread's namespaces.
func Enter(name, host string, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("lab exec: no command")
	}
	l, err := openAny(name)
	if err != nil {
		return err
	}
	if _, err := l.host(host); err != nil {
		return err
	}
	env := l.Environ(os.Environ())
	for _, e := range env {
		if len(e) > 5 && e[:5] == "PATH=" {
			os.Setenv("PATH", e[5:])
		}
	}
	path := argv[0]
	if filepath.Base(path) == path {
		if path, err = exec.LookPath(argv[0]); err != nil {
			return fmt.Errorf("lab exec: %w", err)
		}
	}
	runtime.LockOSThread() // never unlocked: this thread execs
	netFd, err := unix.Open(l.NetNSPath(host), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("host %s: network namespace: %w", host, err)
	}
	utsFd, err := unix.Open(l.utsPath(host), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("host %s: UTS namespace: %w", host, err)
	}
	if err := unix.Setns(netFd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("host %s: join network namespace: %w", host, err)
	}
	if err := unix.Setns(utsFd, unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("host %s: join UTS namespace: %w", host, err)
	}
	unix.Close(netFd)
	unix.Close(utsFd)
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("host %s: mount namespace: %w", host, err)
	}
	// Slave propagation first, else the bind mounts below would propagate
	// back to the machine's own mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("host %s: make mounts private: %w", host, err)
	}
	if err := unix.Mount(l.HostsFilePath(), "/etc/hosts", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("host %s: bind hosts file: %w", host, err)
	}
	// Labs made before resolv.conf existed have none: skip it for them.
	if _, err := os.Stat(l.ResolvConfPath()); err == nil {
		if err := unix.Mount(l.ResolvConfPath(), "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("host %s: bind resolv.conf: %w", host, err)
		}
	}
	// A sysfs of this network namespace, so /sys/class/net shows the host's
	// own interfaces to MPI libraries (UCX, hwloc). Best effort.
	if unix.Unmount("/sys", unix.MNT_DETACH) == nil {
		_ = unix.Mount(name+"-"+host, "/sys", "sysfs", 0, "")
	}
	return syscall.Exec(path, argv, env)
}

// EnterSSH implements the lab's `ssh` agent: `ssh [options] HOST CMD...`
// runs CMD with /bin/sh -c inside HOST (as sshd would run it with the
// user's shell). Without CMD it starts an interactive shell.
func EnterSSH(name string, args []string) error {
	host, command, err := ParseSSHArgs(args)
	if err != nil {
		return err
	}
	if command == "" {
		return Enter(name, host, []string{"/bin/sh", "-i"})
	}
	return Enter(name, host, []string{"/bin/sh", "-c", command})
}
