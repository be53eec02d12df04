package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

const (
	allowedCCPath = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
	defaultCCPath = "/proc/sys/net/ipv4/tcp_congestion_control"
)

func readSysctl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// restrictedCC is an algorithm the kernel has but does not allow as a
// namespace default (cubic on this project's machines), or skips the test.
func restrictedCC(t *testing.T) (cc, allowed string) {
	t.Helper()
	allowed = readSysctl(t, allowedCCPath)
	avail := strings.Fields(readSysctl(t, "/proc/sys/net/ipv4/tcp_available_congestion_control"))
	for _, want := range append([]string{"cubic"}, avail...) {
		if slices.Contains(avail, want) && !slices.Contains(strings.Fields(allowed), want) {
			return want, allowed
		}
	}
	t.Skipf("every available congestion control is allowed here (%s)", allowed)
	return "", ""
}

// TestLabHostCCAllowed: --host-cc with an algorithm missing from
// net.ipv4.tcp_allowed_congestion_control adds it while a lab uses it: the
// lab hosts' default and their connections use it, two labs share it, and
// the list comes back exactly as it was after the last lab's down, after a
// killed lab up, and after a lab's state vanished without its down. The
// machine's own default never changes.
func TestLabHostCCAllowed(t *testing.T) {
	labRequireRoot(t)
	cc, before := restrictedCC(t)
	machineCC := readSysctl(t, defaultCCPath)
	t.Cleanup(func() {
		// Whatever failed above, leave the machine as found.
		if got := readSysctl(t, allowedCCPath); got != before {
			t.Errorf("allowed list %q at the end, want %q (restoring it)", got, before)
			_ = os.WriteFile(allowedCCPath, []byte(before+"\n"), 0o644)
		}
		if got := readSysctl(t, defaultCCPath); got != machineCC {
			t.Errorf("the machine's default congestion control changed: %s, was %s", got, machineCC)
		}
	})
	bin, _ := testbed.Binary()
	pid := os.Getpid() % 10000
	first, second := fmt.Sprintf("e2ehcc%d_1", pid), fmt.Sprintf("e2ehcc%d_2", pid)

	out, err := exec.Command(bin, "lab", "up", "--name", first, "--nodes", "1", "--rtt", "4ms", "--host-cc", cc).CombinedOutput()
	if err != nil {
		t.Fatalf("lab up --host-cc %s: %v\n%s", cc, err, out)
	}
	t.Cleanup(func() { _ = testbed.Down(first); labCheckGone(t, first) })
	if want := "net.ipv4.tcp_allowed_congestion_control: added " + cc; !strings.Contains(string(out), want) {
		t.Errorf("lab up does not say %q:\n%s", want, out)
	}
	if got := strings.Fields(readSysctl(t, allowedCCPath)); !slices.Contains(got, cc) {
		t.Fatalf("allowed list %v while the lab is up, want %s in it", got, cc)
	}
	l, err := testbed.Open(first)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"node-1.site1", "gw.site2", "x-1.site1"} {
		got, err := l.Command(h, "sysctl", "-n", "net.ipv4.tcp_congestion_control").Output()
		if err != nil || strings.TrimSpace(string(got)) != cc {
			t.Errorf("%s: default congestion control %q (%v), want %s", h, got, err, cc)
		}
	}
	labCCOfConnection(t, l, cc)

	// A second lab needs it too: the first one's down keeps it.
	if out, err := exec.Command(bin, "lab", "up", "--name", second, "--nodes", "1", "--rtt", "4ms", "--host-cc", cc).CombinedOutput(); err != nil {
		t.Fatalf("second lab up: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = testbed.Down(second); labCheckGone(t, second) })
	if out, err := exec.Command(bin, "lab", "down", "--name", first).CombinedOutput(); err != nil || strings.Contains(string(out), "restored") {
		t.Fatalf("first lab down: %v\n%s", err, out)
	}
	if got := strings.Fields(readSysctl(t, allowedCCPath)); !slices.Contains(got, cc) {
		t.Fatalf("first lab down removed %s while the second lab uses it: %v", cc, got)
	}
	out, err = exec.Command(bin, "lab", "down", "--name", second).CombinedOutput()
	if err != nil {
		t.Fatalf("second lab down: %v\n%s", err, out)
	}
	if got := readSysctl(t, allowedCCPath); got != before {
		t.Fatalf("allowed list %q after the last lab's down, want %q", got, before)
	}
	if want := fmt.Sprintf("restored to %q", before); !strings.Contains(string(out), want) {
		t.Errorf("lab down does not say %s:\n%s", want, out)
	}

	// A lab up killed after its addition: its lab down restores.
	up := exec.Command(bin, "lab", "up", "--name", first, "--nodes", "1", "--rtt", "4ms", "--host-cc", cc)
	up.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !slices.Contains(strings.Fields(readSysctl(t, allowedCCPath)), cc) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	_ = syscall.Kill(up.Process.Pid, syscall.SIGKILL)
	if err := up.Wait(); err != nil {
		t.Logf("lab up killed after its addition: %v", err)
	} else {
		t.Logf("lab up finished before the kill")
	}
	if got := strings.Fields(readSysctl(t, allowedCCPath)); !slices.Contains(got, cc) {
		t.Fatalf("lab up never added %s (list %v)", cc, got)
	}
	if out, err := exec.Command(bin, "lab", "down", "--name", first).CombinedOutput(); err != nil {
		t.Fatalf("lab down after a killed up: %v\n%s", err, out)
	}
	labCheckGone(t, first)
	if got := readSysctl(t, allowedCCPath); got != before {
		t.Fatalf("allowed list %q after the down of a killed up, want %q", got, before)
	}

	// A lab whose state vanished without its down (moved aside here, as a
	// crash between a down's removal and its restore leaves it): the next
	// lab up of any lab restores the list.
	if out, err := exec.Command(bin, "lab", "up", "--name", first, "--nodes", "1", "--rtt", "4ms", "--host-cc", cc).CombinedOutput(); err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	dir := filepath.Join(testbed.RunDir, first)
	aside := filepath.Join(filepath.Dir(testbed.RunDir), "mpi5k-aside-"+first) // same file system, not a lab
	if err := os.Rename(dir, aside); err != nil {
		t.Fatal(err)
	}
	putBack := func() {
		if _, err := os.Stat(aside); err == nil {
			if err := os.Rename(aside, dir); err != nil {
				t.Errorf("put %s back: %v", dir, err)
			}
		}
	}
	t.Cleanup(putBack) // before the first lab's cleanup Down runs
	out, err = exec.Command(bin, "lab", "up", "--name", second, "--nodes", "1", "--rtt", "4ms").CombinedOutput()
	if err != nil {
		t.Fatalf("lab up of another lab: %v\n%s", err, out)
	}
	if got := readSysctl(t, allowedCCPath); got != before {
		t.Errorf("allowed list %q after a lab up with the other lab's state gone, want %q", got, before)
	}
	if !strings.Contains(string(out), "removed "+cc) {
		t.Errorf("lab up does not say it removed %s:\n%s", cc, out)
	}
	// The lab itself is still there: put its state back and take it down.
	putBack()
	for _, n := range []string{second, first} {
		if out, err := exec.Command(bin, "lab", "down", "--name", n).CombinedOutput(); err != nil {
			t.Errorf("lab down %s: %v\n%s", n, err, out)
		}
		labCheckGone(t, n)
	}
}

// labCCOfConnection checks with ss that a TCP connection from a site1 node
// to a site2 node, opened with the hosts' defaults, runs cc.
func labCCOfConnection(t *testing.T, l *testbed.Lab, cc string) {
	t.Helper()
	server, client := "node-1.site2", "node-1.site1"
	var ln net.Listener
	if err := l.Do(server, func() error {
		var err error
		ln, err = net.Listen("tcp", l.Addr(server).String()+":7301")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			buf := make([]byte, 1<<16)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}
	}()
	var conn net.Conn
	if err := l.Do(client, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", l.Addr(server).String()+":7301", 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := l.CommandContext(ctx, client, "ss", "-tin", "dst", l.Addr(server).String()).Output()
	if err != nil {
		t.Fatalf("ss in %s: %v", client, err)
	}
	if !strings.Contains(string(out), " "+cc+" ") && !strings.Contains(string(out), "\t"+cc+" ") {
		t.Errorf("ss -ti in %s does not show %s:\n%s", client, cc, out)
	}
	t.Logf("ss -ti in %s:\n%s", client, strings.TrimSpace(string(out)))
}

// TestLabCrossMix: lab cross runs a CUBIC and a BBR bulk flow and a CUBIC
// on/off flow together, each with its algorithm (ss in the traffic host),
// all crossing the WAN; an algorithm the kernel lacks is refused naming
// --cc.
func TestLabCrossMix(t *testing.T) {
	labRequireRoot(t)
	avail := strings.Fields(readSysctl(t, "/proc/sys/net/ipv4/tcp_available_congestion_control"))
	if !slices.Contains(avail, "cubic") || !slices.Contains(avail, "bbr") {
		t.Skipf("needs cubic and bbr (available: %v)", avail)
	}
	l := labUp(t, testbed.Config{Nodes: 1, RTT: 10 * time.Millisecond, WANRate: 100e6})
	bin, _ := testbed.Binary()
	run := labCommand(t, bin)
	out, err := exec.Command(bin, "lab", "cross", "--name", l.Name(), "--from", "site1", "--to", "site2", "--cc", "cubic,nosuchcc").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `--cc: "nosuchcc" is not available`) {
		t.Errorf("lab cross --cc cubic,nosuchcc: %v\n%s", err, out)
	}
	got := run("cross", "--name", l.Name(), "--from", "site1", "--to", "site2", "--cc", "cubic,bbr,cubic",
		"--pattern", "bulk,bulk,onoff", "--mean-size", "256KiB", "--mean-gap", "50ms", "--seed", "3", "--duration", "4s")
	if !strings.Contains(got, "3 flow(s): cubic bulk, bbr bulk, cubic onoff") {
		t.Errorf("lab cross says: %s", got)
	}
	time.Sleep(2 * time.Second)
	ss, err := l.Command("x-1.site1", "ss", "-tin", "dst", l.Addr("x-1.site2").String()).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range []string{"cubic", "bbr"} {
		if !strings.Contains(string(ss), "\t "+cc+" ") && !strings.Contains(string(ss), " "+cc+" ") {
			t.Errorf("no %s connection in the traffic host:\n%s", cc, ss)
		}
	}
	time.Sleep(3 * time.Second)
	s, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{5201, 5202, 5203} {
		var bytes uint64
		for _, f := range s.Link("site1", "site2").Flows {
			if strings.HasSuffix(f.Dst, fmt.Sprintf(":%d", port)) {
				bytes += f.Bytes
			}
		}
		t.Logf("flow to port %d: %d bytes across the WAN", port, bytes)
		if bytes < 256<<10 {
			t.Errorf("flow to port %d: only %d bytes crossed the WAN", port, bytes)
		}
	}
	log, err := os.ReadFile(filepath.Join(l.CrossLogDir(), "5203.onoff.log"))
	if err != nil || !strings.Contains(string(log), "done: ") || !strings.Contains(string(log), " 0 failed (cc cubic, seed 5)") {
		t.Errorf("on/off log (%v):\n%s", err, log)
	}
}
