package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where a lab's network namespace files live. Not /run/netns:
// `ip netns add` bind-mounts /run/netns over itself the first time it runs,
// which hides namespace files mounted there before (they can then neither
// be unmounted nor removed). Inspect a lab host with
// `nsenter --net=/run/mpi5k/<lab>/netns/<lab>-<host>` or `mpi5k lab exec`.
func netnsDir(lab string) string { return filepath.Join(RunDir, lab, "netns") }

// createNamedNS creates a new network namespace bound at netPath and, when
// utsPath is set, a UTS namespace with the given hostname bound at utsPath.
// Namespaces belong to threads, so this runs on a locked thread and switches
// it back; if switching back fails the thread stays locked and Go discards
// it when the goroutine ends (never reused in the wrong namespace).
func createNamedNS(netPath, utsPath, hostname string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, clean := createNSLocked(netPath, utsPath, hostname)
		if clean {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func createNSLocked(netPath, utsPath, hostname string) (error, bool) {
	origNet, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err, true
	}
	defer origNet.Close()
	origUTS, err := os.Open("/proc/thread-self/ns/uts")
	if err != nil {
		return err, true
	}
	defer origUTS.Close()
	flags := unix.CLONE_NEWNET
	if utsPath != "" {
		flags |= unix.CLONE_NEWUTS
	}
	if err := unix.Unshare(flags); err != nil {
		return fmt.Errorf("unshare namespaces for %s: %w", hostname, err), true
	}
	var ferr error
	if utsPath != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			ferr = fmt.Errorf("sethostname %s: %w", hostname, err)
		} else {
			ferr = bindNS("/proc/thread-self/ns/uts", utsPath)
		}
	}
	if ferr == nil {
		ferr = bindNS("/proc/thread-self/ns/net", netPath)
	}
	back := unix.Setns(int(origNet.Fd()), unix.CLONE_NEWNET)
	if back == nil && utsPath != "" {
		back = unix.Setns(int(origUTS.Fd()), unix.CLONE_NEWUTS)
	}
	if back != nil {
		return fmt.Errorf("return to the original namespace: %w", back), false
	}
	return ferr, true
}

// bindNS keeps a namespace alive without a process by bind-mounting its
// nsfs file on an empty file.
func bindNS(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("namespace file %s: %w", dst, err)
	}
	f.Close()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		os.Remove(dst)
		return fmt.Errorf("bind namespace to %s: %w", dst, err)
	}
	return nil
}

// removeNSFile unmounts and removes a namespace file; missing is fine.
func removeNSFile(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// inNetNS runs fn on a locked thread inside the network namespace at path.
// Sockets created by fn stay in that namespace after it returns.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open namespace %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: Go drops it when this goroutine exits.
			errc <- fmt.Errorf("leave namespace %s: %w", path, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// writeSysctls writes /proc/sys entries (keys like "net/ipv4/ip_forward")
// inside a namespace: net sysctls follow the writing thread's namespace, so
// the machine's own values are never touched.
func writeSysctls(nsPath string, kv [][2]string) error {
	return inNetNS(nsPath, func() error {
		for _, e := range kv {
			p := "/proc/sys/" + strings.TrimPrefix(e[0], "/")
			if err := os.WriteFile(p, []byte(e[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s: %w", e[0], e[1], err)
			}
		}
		return nil
	})
}

// nsInode identifies a namespace file for matching /proc/<pid>/ns/net.
func nsInode(path string) (uint64, uint64, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, false
	}
	return st.Dev, st.Ino, true
}

// netlinkIn opens a netlink handle whose sockets live in the network
// namespace at path (the namespace's descriptor is not kept).
func netlinkIn(path string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}
