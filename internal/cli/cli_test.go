package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// Each value type refuses what is out of its range, naming the value.
func TestValues(t *testing.T) {
	var n, size int
	var rate uint64
	var d time.Duration
	var word string
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.Var(Port(&n), "port", "")
	fs.Var(&Size{P: &size, Min: 1, Max: 1 << 20}, "size", "")
	fs.Var(&Rate{P: &rate}, "rate", "")
	fs.Var(Duration{P: &d}, "d", "")
	fs.Var(Choice{P: &word, Words: []string{"info", "debug"}}, "level", "")
	for _, tc := range []struct{ arg, want string }{
		{"--port=70000", `invalid argument "70000" for "--port" flag: port 70000 out of range 1..65535`},
		{"--port=-1", "port -1 out of range 1..65535"},
		{"--port=x", "want a whole number from 1 to 65535"},
		{"--size=0", "size 0 out of range 1..1MiB"},
		{"--size=2MiB", "size 2MiB out of range 1..1MiB"},
		{"--rate=fast", `bad rate "fast"`},
		{"--d=-1s", `negative duration "-1s"`},
		{"--level=loud", "want info, debug"},
	} {
		if err := fs.Parse([]string{tc.arg}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.arg, err, tc.want)
		}
	}
	if err := fs.Parse([]string{"--port=65535", "--size=64KiB", "--rate=1gbit", "--d=2ms", "--level=DEBUG"}); err != nil {
		t.Fatal(err)
	}
	if n != 65535 || size != 64<<10 || rate != 1e9 || d != 2*time.Millisecond || word != "debug" {
		t.Errorf("parsed %d %d %d %v %q", n, size, rate, d, word)
	}
	if s := fs.Lookup("size").Value.String(); s != "64KiB" {
		t.Errorf("size renders as %q", s)
	}
}

// Help goes to stdout with status 0, mistakes to stderr with the hint and 2;
// advanced flags are hidden from the help and listed apart.
func TestCommandParse(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Bool("plain", false, "a user flag")
	fs.Bool("knob", false, "an advanced flag")
	MarkAdvanced(fs, "knob")
	var out, errb bytes.Buffer
	cmd := Command{Name: "x", Stdout: &out, Stderr: &errb}
	cmd.Help = func(w io.Writer) { w.Write([]byte(fs.FlagUsages())) }
	if code, done := cmd.Parse(fs, []string{"--help"}); code != ExitOK || !done || !strings.Contains(out.String(), "--plain") ||
		strings.Contains(out.String(), "--knob") || errb.Len() > 0 {
		t.Errorf("--help: %d %v stdout %q stderr %q", code, done, out.String(), errb.String())
	}
	if u := AdvancedUsages(fs); !strings.Contains(u, "--knob") || strings.Contains(u, "--plain") {
		t.Errorf("advanced usages %q", u)
	}
	out.Reset()
	if code, done := cmd.Parse(fs, []string{"--frob"}); code != ExitUsage || !done || errb.String() != "x: unknown flag: --frob\nRun 'x --help' for usage.\n" || out.Len() > 0 {
		t.Errorf("--frob: %d %v stdout %q stderr %q", code, done, out.String(), errb.String())
	}
	if code, done := cmd.Parse(fs, []string{"--knob"}); code != ExitOK || done {
		t.Errorf("an advanced flag is not taken: %d %v", code, done)
	}
}

// TestCloseInheritedOnExec: a descriptor opened without O_CLOEXEC, as one
// inherited from flock(1) is, does not reach a child after the call.
func TestCloseInheritedOnExec(t *testing.T) {
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	path := fmt.Sprintf("/proc/self/fd/%d", fd)
	probe := func() bool { return exec.Command("test", "-e", path).Run() == nil }
	if !probe() {
		t.Fatalf("the child did not inherit fd %d before the call: the probe cannot tell", fd)
	}
	if err := CloseInheritedOnExec(); err != nil {
		t.Fatal(err)
	}
	if probe() {
		t.Errorf("fd %d still reaches a child", fd)
	}
}

// TestSubcommand: no word is a usage error with the usage on stderr,
// help words print it on stdout, anything else is the subcommand.
func TestSubcommand(t *testing.T) {
	for _, c := range []struct {
		args        []string
		sub         string
		code        int
		done        bool
		out, errOut string
	}{
		{nil, "", ExitUsage, true, "", "U"},
		{[]string{"--help"}, "", ExitOK, true, "U", ""},
		{[]string{"help", "x"}, "", ExitOK, true, "U", ""},
		{[]string{"up", "--sites", "2"}, "up", ExitOK, false, "", ""},
	} {
		var out, errOut strings.Builder
		sub, rest, code, done := Subcommand(c.args, "U", &out, &errOut)
		if sub != c.sub || code != c.code || done != c.done || out.String() != c.out || errOut.String() != c.errOut {
			t.Errorf("%q: %q %v %d %v, stdout %q stderr %q", c.args, sub, rest, code, done, out.String(), errOut.String())
		}
		if !done && len(rest) != len(c.args)-1 {
			t.Errorf("%q: rest %q", c.args, rest)
		}
	}
}
