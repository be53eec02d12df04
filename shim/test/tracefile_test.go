package shimtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/trace"
)

// tracedAs runs the "conn" client traced into dir, after plant (shell
// commands, run by the process itself before it execs the client, with
// $p = dir/<host>.<pid>, the prefix of the trace's name) has put files
// there as a local user sharing the directory could. It returns the
// client's pid and stderr.
func tracedAs(t *testing.T, dir, plant string) (int, string) {
	t.Helper()
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range l.env("a", "MPI5K_TRACE="+dir) {
		if !strings.HasPrefix(e, "LD_PRELOAD=") {
			env = append(env, e)
		}
	}
	// The shell is not traced; exec keeps its pid for the client.
	script := `set -e; p="$TR_DIR/$TR_HOST.$$"; ` + plant + `; export LD_PRELOAD="$TR_LIB"; exec "$@"`
	cmd := exec.Command("sh", "-c", script, "sh", progPath, "conn", srcA, "127.0.2.1", fmt.Sprint(port))
	cmd.Env = append(env, "TR_DIR="+dir, "TR_HOST="+host, "TR_LIB="+libPath)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		err = <-done
	}
	if err != nil {
		t.Fatalf("traced client: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	return cmd.Process.Pid, errb.String()
}

// traceFileOf checks that path is a regular trace file of pid, created
// with mode perm, and returns its stat.
func traceFileOf(t *testing.T, path string, pid int, perm os.FileMode) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("no trace file: %v", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != perm {
		t.Errorf("%s is %v, want a regular file of mode %v", path, fi.Mode(), perm)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if r.Header.PID != uint32(pid) {
		t.Errorf("%s is the trace of pid %d, want %d", path, r.Header.PID, pid)
	}
	return fi.Sys().(*syscall.Stat_t)
}

// victim is a file outside the trace directory that planted symlinks
// point at; untouched checks it still holds what it held.
func victim(t *testing.T) (path string, untouched func()) {
	path = filepath.Join(t.TempDir(), "precious")
	const content = "someone else's file\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, func() {
		t.Helper()
		if b, err := os.ReadFile(path); err != nil || string(b) != content {
			t.Errorf("the file a planted symlink points at now holds %d bytes (%.40q), %v", len(b), b, err)
		}
	}
}

func isSymlinkTo(t *testing.T, link, target string) {
	t.Helper()
	if got, err := os.Readlink(link); err != nil || got != target {
		t.Errorf("%s: readlink %q, %v; want the planted symlink to %s", link, got, err, target)
	}
}

// TestTraceFileCreated: a process's trace is DIR/<host>.<pid>.trace, the
// owner's alone, and nothing else is left in DIR.
func TestTraceFileCreated(t *testing.T) {
	dir := t.TempDir()
	pid, _ := tracedAs(t, dir, "true")
	host, _ := os.Hostname()
	traceFileOf(t, filepath.Join(dir, fmt.Sprintf("%s.%d.trace", host, pid)), pid, 0o600)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("trace directory holds %d entries, want the one trace", len(ents))
	}
}

// TestTraceFilePlantedSymlinks: a local user who shares the trace
// directory plants a symlink at the trace's name, another at the
// temporary name it used to be written under, and a file of an earlier
// process at the next name. The files they point at and the earlier
// file are untouched, the links stay, and the trace goes to the next
// free name.
func TestTraceFilePlantedSymlinks(t *testing.T) {
	dir := t.TempDir()
	target, untouched := victim(t)
	pid, stderr := tracedAs(t, dir, fmt.Sprintf(`ln -s %q "$p.trace"; ln -s %q "$p.trace.tmp"; echo earlier > "$p.1.trace"`, target, target))
	untouched()
	host, _ := os.Hostname()
	p := filepath.Join(dir, fmt.Sprintf("%s.%d", host, pid))
	isSymlinkTo(t, p+".trace", target)
	isSymlinkTo(t, p+".trace.tmp", target)
	if b, err := os.ReadFile(p + ".1.trace"); err != nil || string(b) != "earlier\n" {
		t.Errorf("the earlier process's file now holds %q (%v)", b, err)
	}
	traceFileOf(t, p+".2.trace", pid, 0o600)
	if !strings.Contains(stderr, "exists (not overwritten)") {
		t.Errorf("stderr does not say the trace went elsewhere:\n%s", stderr)
	}
}

// TestTraceFileRefused: every name the trace may take is planted. The
// process runs untraced and says so once on stderr; nothing is written
// through the symlinks.
func TestTraceFileRefused(t *testing.T) {
	dir := t.TempDir()
	target, untouched := victim(t)
	pid, stderr := tracedAs(t, dir, fmt.Sprintf(`ln -s %q "$p.trace"; for n in 1 2 3 4 5 6 7; do ln -s %q "$p.$n.trace"; done`, target, target))
	untouched()
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		if fi, err := os.Lstat(f); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is not one of the planted symlinks", f)
		}
	}
	if len(files) != 8 {
		t.Errorf("trace directory holds %d entries, want the 8 planted", len(files))
	}
	if n := strings.Count(stderr, "tracing off"); n != 1 || !strings.Contains(stderr, "not overwritten") {
		t.Errorf("pid %d: want one clear refusal on stderr, got %d:\n%s", pid, n, stderr)
	}
}

// TestTraceFileSetgidDir: in a setgid directory (a team's), the trace
// takes the directory's group and that group may read it.
func TestTraceFileSetgidDir(t *testing.T) {
	dir := t.TempDir()
	gid := os.Getgid()
	if os.Getuid() == 0 {
		gid = 4242 // root can give the directory a group it is not in
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		t.Skip("cannot set the directory's group:", err)
	}
	if err := os.Chmod(dir, 0o770|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	pid, _ := tracedAs(t, dir, "true")
	host, _ := os.Hostname()
	st := traceFileOf(t, filepath.Join(dir, fmt.Sprintf("%s.%d.trace", host, pid)), pid, 0o640)
	if int(st.Gid) != gid {
		t.Errorf("trace has group %d, want the directory's %d", st.Gid, gid)
	}
}
