//go:build linux

package afpacket

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// veth is a veth pair between two network namespaces this test creates:
// mxt-<pid>-a holds mxa (10.77.0.1, 02:00:00:77:00:01), mxt-<pid>-b holds
// mxb (10.77.0.2, 02:00:00:77:00:02). Root only; removed by Cleanup.
type veth struct {
	nsA, nsB string
	ipA, ipB string
}

func sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newVeth(t testing.TB) *veth {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and raw sockets")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	removeStale()
	v := &veth{nsA: fmt.Sprintf("mxt-%d-a", os.Getpid()), nsB: fmt.Sprintf("mxt-%d-b", os.Getpid()),
		ipA: "10.77.0.1", ipB: "10.77.0.2"}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", v.nsA).Run()
		exec.Command("ip", "netns", "del", v.nsB).Run()
	})
	sh(t, "ip", "netns", "add", v.nsA)
	sh(t, "ip", "netns", "add", v.nsB)
	mtu := "1500"
	if m := os.Getenv("MXT_MTU"); m != "" { // jumbo frames: MXT_MTU=9000
		mtu = m
	}
	sh(t, "ip", "-n", v.nsA, "link", "add", "mxa", "mtu", mtu, "address", "02:00:00:77:00:01", "type", "veth",
		"peer", "name", "mxb", "mtu", mtu, "address", "02:00:00:77:00:02", "netns", v.nsB)
	// A second pair for a second engine per host (one engine owns an
	// interface's MX frames).
	sh(t, "ip", "-n", v.nsA, "link", "add", "mxc", "mtu", mtu, "address", "02:00:00:77:00:03", "type", "veth",
		"peer", "name", "mxd", "mtu", mtu, "address", "02:00:00:77:00:04", "netns", v.nsB)
	for _, s := range []struct{ ns, dev, ip string }{{v.nsA, "mxa", v.ipA}, {v.nsB, "mxb", v.ipB},
		{v.nsA, "mxc", "10.77.1.1"}, {v.nsB, "mxd", "10.77.1.2"}} {
		sh(t, "ip", "-n", s.ns, "addr", "add", s.ip+"/24", "dev", s.dev)
		sh(t, "ip", "-n", s.ns, "link", "set", s.dev, "up")
		sh(t, "ip", "-n", s.ns, "link", "set", "lo", "up")
	}
	return v
}

// in runs f on a thread inside namespace ns: sockets it creates stay in
// ns for their whole life, whichever thread uses them later.
func in(t testing.TB, ns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer netns.Set(orig)
	f()
}

// removeStale deletes namespaces an earlier run of these tests left when
// it was killed before its cleanup (mxt-<pid>-x, pid no longer running).
func removeStale() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		var pid int
		var side string
		if n, _ := fmt.Sscanf(strings.ReplaceAll(name, "-", " "), "mxt %d %s", &pid, &side); n != 2 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			exec.Command("ip", "netns", "del", name).Run()
		}
	}
}
