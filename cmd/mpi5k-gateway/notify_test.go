package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// freePort is a loopback TCP port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSystemdService runs the built gateway as systemd would run the
// unit: Type=notify (NOTIFY_SOCKET) and stderr connected to the journal
// (JOURNAL_STREAM). It must report READY=1 once its links are up (a map
// without peers has none to wait for), RELOADING=1 and READY=1 around a
// SIGHUP, STOPPING=1 on SIGTERM, and write each log line with the
// priority prefix the journal files it under, without a time of its own.
func TestSystemdService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the gateway")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "mpi5k-gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sockPath := filepath.Join(dir, "notify")
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	mapPath := filepath.Join(dir, "sites.map")
	text := fmt.Sprintf("site s1 id=1 lan=127.0.0.1:%d wan=127.0.0.1:%d\n", freePort(t), freePort(t))
	if err := os.WriteFile(mapPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "journal")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(logf.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--map", mapPath, "--site", "s1")
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sockPath, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	next := func(want string) {
		t.Helper()
		buf := make([]byte, 4096)
		sock.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			n, err := sock.Read(buf)
			if err != nil {
				t.Fatalf("waiting for %q: %v", want, err)
			}
			if strings.Contains(string(buf[:n]), want) {
				return
			}
		}
	}
	next("READY=1\nSTATUS=serving; every WAN link up")
	cmd.Process.Signal(syscall.SIGHUP)
	next("RELOADING=1")
	next("READY=1")
	cmd.Process.Signal(syscall.SIGTERM)
	next("STOPPING=1")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway after SIGTERM: %v", err)
	}
	b, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		t.Fatalf("gateway logged %d lines:\n%s", len(lines), b)
	}
	for _, l := range lines {
		if len(l) < 3 || l[0] != '<' || l[2] != '>' || !strings.ContainsRune("34567", rune(l[1])) {
			t.Errorf("line without a journal priority: %q", l)
		}
		if strings.Contains(l, "time=") {
			t.Errorf("line with a time of its own: %q", l)
		}
	}
}
