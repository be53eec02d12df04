package e2e

// Host hygiene: nothing a gateway does outlives it. Network sysctls are
// per network namespace, so a gateway pair runs in a namespace of the
// test's own, is killed with SIGKILL (no exit path, no deferred restore),
// and every net.* sysctl of that namespace must read as before.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// netSysctls reads every net.* sysctl of network namespace ns.
func netSysctls(t *testing.T, ns string) map[string]string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-a", "-r", `^net\.`).Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("sysctl -a in %s: %v", ns, err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " = "); ok {
			m[k] = v
		}
	}
	if len(m) < 100 {
		t.Fatalf("read %d net.* sysctls in %s, want hundreds:\n%s", len(m), ns, out)
	}
	return m
}

func TestGatewaySIGKILLLeavesHostSettings(t *testing.T) {
	labRequireRoot(t)
	bin := gatewayBinary(t)
	ns := fmt.Sprintf("mpi5k-hyg-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}
	before := netSysctls(t, ns)
	if before["net.ipv4.tcp_slow_start_after_idle"] != "1" {
		t.Fatalf("a new namespace has tcp_slow_start_after_idle %q, want the kernel's 1", before["net.ipv4.tcp_slow_start_after_idle"])
	}

	// Two sites on loopback addresses: the WAN links come up between them,
	// BBR bulk and a CUBIC express link, which the gateway once kept warm
	// by writing the sysctl.
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "sites.map")
	os.WriteFile(mapPath, []byte(`site a id=1 lan=127.0.1.1:5000 wan=127.0.1.1:5001
site b id=2 lan=127.0.2.1:5000 wan=127.0.2.1:5001
net a 127.0.1.0/24
net b 127.0.2.0/24
`), 0o644)
	var cmds []*exec.Cmd
	logs := map[string]*bytes.Buffer{}
	for _, site := range []string{"a", "b"} {
		var log bytes.Buffer
		logs[site] = &log
		c := exec.Command("ip", "netns", "exec", ns, bin, "--map", mapPath, "--site", site,
			"--ready-file", filepath.Join(dir, site+".ready"))
		c.Stderr = &log
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, site := range []string{"a", "b"} {
		for {
			if _, err := os.Stat(filepath.Join(dir, site+".ready")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateways not ready after 15 s; site a logged:\n%s\nsite b:\n%s", logs["a"], logs["b"])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	running := netSysctls(t, ns)
	for _, c := range cmds {
		// ip netns exec execs the gateway itself: this is the gateway's pid.
		if err := c.Process.Signal(os.Kill); err != nil {
			t.Fatal(err)
		}
		c.Wait()
	}
	after := netSysctls(t, ns)
	for k, v := range before {
		if running[k] != v {
			t.Errorf("while the gateways ran: %s = %s, was %s", k, running[k], v)
		}
		if after[k] != v {
			t.Errorf("after SIGKILL of the gateways: %s = %s, was %s", k, after[k], v)
		}
	}
	// The gateway says the links will not stay warm, and how to fix it.
	for _, site := range []string{"a", "b"} {
		if l := logs[site].String(); !strings.Contains(l, "sysctl -w net.ipv4.tcp_slow_start_after_idle=0") {
			t.Errorf("site %s's log does not give the keep-warm fix:\n%s", site, l)
		}
	}
}
