package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// buildMpi5k builds this command into a directory every user may read.
func buildMpi5k(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		os.Chmod(d, 0o755)
	}
	bin := filepath.Join(dir, "mpi5k")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// With HOSTS, doctor runs itself on each through the launcher (here one
// that runs the command line locally through a shell, as ssh does on the
// host), prefixes each report with its host, and
// has every host dial the others' WAN port; a launcher that fails is a
// FAIL line of that host with the fix.
func TestDoctorHosts(t *testing.T) {
	bin := buildMpi5k(t)
	launcher := filepath.Join(t.TempDir(), "launch")
	os.WriteFile(launcher, []byte("#!/bin/sh\nshift\nexec sh -c \"$*\"\n"), 0o755)
	var wan string
	var out []byte
	var err error
	for range 3 { // a port found free may be taken by another process before doctor checks it
		wan = strconv.Itoa(freePort(t))
		out, err = exec.Command(bin, "doctor", "--launcher", launcher, "--mpi5k", bin, "--lan-port", "0", "--wan-port", wan,
			"--preload", "", "127.0.0.1", "localhost").Output()
		if !strings.Contains(string(out), "TCP "+wan+" is in use") {
			break
		}
	}
	if err != nil {
		t.Fatalf("mpi5k doctor: %v\n%s", err, out)
	}
	for _, want := range []string{"127.0.0.1: OK   WAN port      TCP " + wan + " is free", "127.0.0.1: OK   launcher      " + launcher + " reached 127.0.0.1 and ran mpi5k there",
		"localhost: OK   job ports ", "localhost: OK   MPI ", "localhost: OK   service ", "localhost: OK   reach 127.0.0.1:" + wan + " ",
		"127.0.0.1: OK   reach localhost:" + wan + " ", "localhost: ", "keep warm"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(l, "127.0.0.1: ") && !strings.HasPrefix(l, "localhost: ") {
			t.Errorf("line without its host: %q", l)
		}
	}
	// --json: one object, the same checks, the launcher's failure a result.
	picky := filepath.Join(t.TempDir(), "launch")
	os.WriteFile(picky, []byte("#!/bin/sh\n[ \"$1\" != h1.invalid ] || { echo 'ssh: Could not resolve hostname h1.invalid' >&2; exit 255; }\nshift\nexec sh -c \"$*\"\n"), 0o755)
	out, err = exec.Command(bin, "doctor", "--json", "--launcher", picky, "--mpi5k", bin, "--lan-port", "0", "--wan-port", "0",
		"--preload", "", "127.0.0.1", "h1.invalid").Output()
	var rep struct {
		Hosts []struct {
			Host    string
			Results []struct{ Status, Check, Detail, Fix string }
		}
		Failed bool
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	if len(rep.Hosts) != 2 || rep.Hosts[0].Host != "127.0.0.1" || len(rep.Hosts[0].Results) < 8 || rep.Hosts[0].Results[0].Check != "launcher" ||
		rep.Hosts[0].Results[0].Status != "OK" || !rep.Failed || exitCode(err) != 1 {
		t.Errorf("doctor --json (exit %d):\n%s", exitCode(err), out)
	}
	if len(rep.Hosts) == 2 {
		if r := rep.Hosts[1].Results; len(r) != 1 || r[0].Status != "FAIL" || r[0].Check != "launcher" || r[0].Fix == "" {
			t.Errorf("doctor --json, a host the launcher cannot run on: %+v", r)
		}
	}
	out, err = exec.Command(bin, "doctor", "--launcher", "false", "h1").Output()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "h1: FAIL launcher") || !strings.Contains(string(out), "fix: check that --launcher reaches the host") {
		t.Errorf("failing launcher: exit %d\n%s", code, out)
	}
}

func exitCode(err error) int {
	if e, ok := err.(*exec.ExitError); ok {
		return e.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// doctor runs as an ordinary user: it reports, it needs no privilege.
func TestDoctorNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to nobody")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv not installed (util-linux)")
	}
	bin := buildMpi5k(t)
	out, err := exec.Command("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
		bin, "doctor", "--lan-port", "0", "--wan-port", "0", "--preload", "").CombinedOutput()
	if code := exitCode(err); code != 0 && code != 1 {
		t.Fatalf("mpi5k doctor as nobody: %v\n%s", err, out)
	}
	for _, want := range []string{"kernel ", "cc bbr ", "cc cubic ", "no CAP_NET_ADMIN", "keep warm ", "clock "} {
		if !strings.Contains(string(out), want) {
			t.Errorf("report as nobody lacks %q:\n%s", want, out)
		}
	}
}
