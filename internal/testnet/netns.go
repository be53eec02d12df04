package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// Run runs a command a test needs to succeed (ip, tc, sysctl) and fails
// the test with its output if it does not.
func Run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// NeedRoot skips the test unless it runs as root with every tool (ip
// first) on the PATH: network namespaces need both.
func NeedRoot(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

// Netns creates one network namespace per side, named prefix-<pid>-side,
// with lo up, and deletes them when the test ends; it returns their names.
// Namespaces of the prefix that a killed run left (their pid gone) are
// deleted first. The test is skipped where namespaces cannot be created.
func Netns(t testing.TB, prefix string, sides ...string) []string {
	t.Helper()
	NeedRoot(t)
	removeStale(prefix)
	var names []string
	for _, side := range sides {
		ns := fmt.Sprintf("%s-%d-%s", prefix, os.Getpid(), side)
		exec.Command("ip", "netns", "del", ns).Run()
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Skipf("cannot create network namespaces here: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		names = append(names, ns)
	}
	return names
}

// removeStale deletes namespaces prefix-<pid>-* whose pid no longer runs.
func removeStale(prefix string) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, prefix+"-")
		if !ok {
			continue
		}
		var pid int
		if n, _ := fmt.Sscanf(strings.ReplaceAll(rest, "-", " "), "%d", &pid); n != 1 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			exec.Command("ip", "netns", "del", name).Run()
		}
	}
}

// In runs f with the calling thread in namespace ns: sockets f creates
// live there for their whole life, whichever thread uses them later.
func In(t testing.TB, ns string, f func()) {
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
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // never hand a thread in the wrong namespace back to Go
		}
	}()
	f()
}
