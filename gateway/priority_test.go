package gateway

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestRaisePriority runs RaisePriority in a child that leads its own
// session, as mpi5k run and systemd start a gateway, and checks every
// thread and the autogroup. Raising nice needs no privilege.
func TestRaisePriority(t *testing.T) {
	if os.Getenv("MPI5K_TEST_PRIORITY_CHILD") == "1" {
		if err := RaisePriority(7); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(3)
		}
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
			if err != nil {
				continue
			}
			// Field 19 is nice; the command name in field 2 may hold spaces.
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
			if f[16] != "7" {
				os.Stderr.WriteString("thread " + task.Name() + " nice " + f[16])
				os.Exit(4)
			}
		}
		if b, err := os.ReadFile("/proc/self/autogroup"); err == nil && !strings.HasSuffix(strings.TrimSpace(string(b)), "nice 7") {
			os.Stderr.WriteString("autogroup: " + string(b))
			os.Exit(5)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestRaisePriority$")
	cmd.Env = append(os.Environ(), "MPI5K_TEST_PRIORITY_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	if err := RaisePriority(-21); err == nil || !strings.Contains(err.Error(), "--priority -21") {
		t.Errorf("nice -21: %v", err)
	}
}
