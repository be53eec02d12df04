package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBinaries builds mpi5k and mpi5k-gateway into a temporary directory,
// as `make` does, with a known version.
func buildBinaries(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	dir := t.TempDir()
	for _, pkg := range []string{".", "../mpi5k-gateway"} {
		name := filepath.Base(pkg)
		if pkg == "." {
			name = "mpi5k"
		}
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=v-test", "-o", filepath.Join(dir, name), pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// TestCommandLines runs the built binaries with wrong and right command
// lines: every mistake is refused before anything starts, with a message
// on stderr naming the flag and the value given and a hint to --help, and
// exit status 2; help and versions go to stdout with status 0; runtime
// failures exit 1 and name the user's file.
func TestCommandLines(t *testing.T) {
	bin := buildBinaries(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// No case may start a gateway; were one wrongly to, it listens out of
	// everyone's way and the timeout below ends it.
	goodMap := write("good.map", "site s1 id=1 lan=127.77.0.1:47000 wan=127.77.0.1:47001\n")
	badMap := write("bad.map", "site s1 id=1 lan=127.0.0.1:5000\n")
	dupSites := write("dup.sites", "127.0.0.2 x\n127.0.0.3 y\n127.0.0.2 y\n")
	badSites := write("bad.sites", "127.0.0.2 x extra\n")
	oneSite := write("one.sites", "127.0.0.2 x\n127.0.0.3 x\n")
	twoSites := write("two.sites", "127.0.0.2 x\n127.0.0.3 y\n")
	exit7 := write("exit7", "#!/bin/sh\nexit 7\n")
	gw := []string{"mpi5k-gateway", "--map", goodMap, "--site", "s1"}
	// mpiexec resolving to Open MPI's orterun, as Debian's alternatives do.
	orterun := write("orterun", "#!/bin/sh\nexit 0\n")
	mpiexec := filepath.Join(dir, "mpiexec")
	if err := os.Symlink(orterun, mpiexec); err != nil {
		t.Fatal(err)
	}
	sitesDir := filepath.Join(dir, "dir.sites")
	if err := os.Mkdir(sitesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	job := []string{"mpirun", "-np", "2", "-H", "127.0.0.2,127.0.0.3", "true"}
	// --dry-run: a wrapper that wrongly took a value prints, not starts.
	run := func(flags ...string) []string {
		return append(append([]string{"mpi5k", "run", "--dry-run", "--sites", twoSites}, flags...), job...)
	}
	const hint = "--help' for usage.\n"
	for _, tc := range []struct {
		args   []string
		status int
		stderr []string // each must appear on stderr
		stdout string   // must appear on stdout
	}{
		// mpi5k-gateway
		{[]string{"mpi5k-gateway", "--frobnicate"}, 2, []string{"mpi5k-gateway: unknown flag: --frobnicate", "Run 'mpi5k-gateway " + hint}, ""},
		{[]string{"mpi5k-gateway", "--help"}, 0, nil, "usage: mpi5k-gateway --map FILE --site NAME"},
		{[]string{"mpi5k-gateway", "--help-advanced"}, 0, nil, "--wan-skip-probe-rtt"},
		{[]string{"mpi5k-gateway", "--version"}, 0, nil, "mpi5k-gateway v-test\n"},
		{[]string{"mpi5k-gateway"}, 2, []string{"--map FILE and --site NAME are required", hint}, ""},
		{append(gw, "--wan-conns", "0"), 2, []string{`invalid argument "0" for "--wan-conns" flag: bulk WAN connections 0 out of range 1..63`, hint}, ""},
		{append(gw, "--cpu-profile", "prof"), 2, []string{`invalid argument "prof" for "--cpu-profile" flag: "prof" is not an absolute path`, hint}, ""},
		{run("--cpu-profile", "/tmp/prof"), 0, nil, "--cpu-profile=/tmp/prof"},
		{append(gw, "--wan-conns", "-3"), 2, []string{`invalid argument "-3" for "--wan-conns"`, "out of range 1..63", hint}, ""},
		{append(gw, "--wan-cc", "bogus"), 2, []string{`invalid argument "bogus" for "--wan-cc" flag: congestion control "bogus": not offered by this kernel`, "net.ipv4.tcp_available_congestion_control", hint}, ""},
		{append(gw, "--metrics", ":65537"), 2, []string{`--metrics ":65537": port 65537 out of range 1..65535`, hint}, ""},
		{append(gw, "--window", "0"), 2, []string{`invalid argument "0" for "--window" flag: size 0 out of range 1..1GiB`, hint}, ""},
		{append(gw, "--log-level", "loud"), 2, []string{`invalid argument "loud" for "--log-level" flag: want debug, info, warn, error`, hint}, ""},
		{append(gw, "extra"), 2, []string{`unexpected argument "extra"`, hint}, ""},
		{append(gw, "--lan-forward", "bogus"), 2, []string{`invalid argument "bogus" for "--lan-forward" flag: want chunked, pipelined`, hint}, ""},
		{append(gw, "--lan-forward", "pipelined"), 2, []string{"--lan-forward pipelined applies to --lan-transport mx only", hint}, ""},
		{[]string{"mpi5k-gateway", "--help-advanced"}, 0, nil, "--lan-forward"},
		{[]string{"mpi5k-gateway", "--map", goodMap, "--site", "zz"}, 2, []string{`--site "zz": no such site in ` + goodMap + "; its sites: s1 (give one of them", hint}, ""},
		{append(gw, "--lan", "1.2.3.4:70000"), 2, []string{`invalid argument "1.2.3.4:70000" for "--lan" flag: port 70000 out of range 1..65535`, hint}, ""},
		{append(gw, "--lan", "gw.site1:5000"), 2, []string{`"gw.site1" is not an IP address (give the host's address, not its name)`, hint}, ""},
		{[]string{"mpi5k-gateway", "--map", badMap, "--site", "s1"}, 1, []string{badMap + ":1: site s1 has no gateway"}, ""},
		{[]string{"mpi5k-gateway", "--map", filepath.Join(dir, "nomap"), "--site", "s1"}, 1, []string{filepath.Join(dir, "nomap")}, ""},

		// mpi5k
		{[]string{"mpi5k", "--version"}, 0, nil, "mpi5k v-test\n"},
		{[]string{"mpi5k", "version"}, 0, nil, "mpi5k v-test\n"},
		{[]string{"mpi5k", "--version"}, 0, nil, "built with " + runtime.Version() + " for linux/"},
		{[]string{"mpi5k-gateway", "--version"}, 0, nil, "\nkernel: Linux "},
		{[]string{"mpi5k", "--help"}, 0, nil, "usage: mpi5k <command>"},
		{[]string{"mpi5k", "--frobnicate"}, 2, []string{`mpi5k: unknown flag "--frobnicate"`, "Run 'mpi5k " + hint}, ""},
		{[]string{"mpi5k", "frobnicate"}, 2, []string{`mpi5k: unknown command "frobnicate"`, hint}, ""},
		{[]string{"mpi5k", "doctor", "--frobnicate"}, 2, []string{"mpi5k doctor: unknown flag: --frobnicate", "Run 'mpi5k doctor " + hint}, ""},
		{[]string{"mpi5k", "doctor", "--lan-port", "70000"}, 2, []string{`invalid argument "70000" for "--lan-port" flag: port 70000 out of range 0..65535`, hint}, ""},
		{[]string{"mpi5k", "doctor", "--help"}, 0, nil, "usage: mpi5k doctor"},
		{[]string{"mpi5k", "doctor", "--reach", "127.0.0.1"}, 2, []string{`--reach "127.0.0.1": want HOST:PORT, e.g. gw.site2:5001`, hint}, ""},
		{[]string{"mpi5k", "doctor", "--reach", "127.0.0.1:0"}, 2, []string{`--reach "127.0.0.1:0": port "0" out of range 1..65535`, hint}, ""},
		{[]string{"mpi5k", "run", "-np", "4", "mpirun", "./x"}, 2, []string{"unknown shorthand flag: 'n' in -np", "mpi5k run's own flags come before the launcher, the launcher's after it: mpi5k run [flags] mpirun -np 4 ./app", hint}, ""},
		{[]string{"mpi5k", "run", "--help"}, 0, nil, "75 a gateway failed while the job ran"},
		{[]string{"mpi5k", "run", "--dry-run", "--sites", twoSites, mpiexec, "-f", twoSites, "./x"}, 2, []string{"-f is MPICH's host option, but " + mpiexec + " is Open MPI's launcher (flavour openmpi, found as " + orterun + "), which does not take it: give it its own (-H, ", "mpiexec.mpich", hint}, ""},
		{run("--sites", sitesDir), 2, []string{"--sites: " + sitesDir, "is a directory", hint}, ""},
		{[]string{"mpi5k", "run", "--help"}, 0, nil, "the MPI launcher's own status"},
		{[]string{"mpi5k", "run", "--help-advanced"}, 0, nil, "--wan-rto-min"},
		{run("--lan-port", "5000", "--wan-port", "5001", "--metrics-port", "5002"), 0, nil, "--site y --metrics 127.0.0.3:5002 --exit-on-stdin-eof --ready-tag "},
		{run("--frobnicate"), 2, []string{"mpi5k run: unknown flag: --frobnicate", "Run 'mpi5k run " + hint}, ""},
		{run("--lan-port", "70000"), 2, []string{`invalid argument "70000" for "--lan-port" flag: port 70000 out of range 1..65535`, hint}, ""},
		{run("--lan-port", "-1"), 2, []string{`invalid argument "-1" for "--lan-port" flag: port -1 out of range 1..65535`, hint}, ""},
		{run("--wan-port", "0"), 2, []string{`invalid argument "0" for "--wan-port" flag: port 0 out of range`, hint}, ""},
		{run("--metrics-port", "65537"), 2, []string{`invalid argument "65537" for "--metrics-port" flag: port 65537 out of range 1..65535`, hint}, ""},
		{run("--lan-port", "5000", "--metrics-port", "5000"), 2, []string{"--metrics-port 5000: --lan-port is 5000 too", hint}, ""},
		{run("--wan-conns", "0"), 2, []string{`invalid argument "0" for "--wan-conns" flag: bulk WAN connections 0 out of range 1..63`, hint}, ""},
		{run("--wan-conns", "-3"), 2, []string{`invalid argument "-3" for "--wan-conns"`, hint}, ""},
		{run("--wan-cc", "bogus"), 2, []string{`invalid argument "bogus" for "--wan-cc" flag: no congestion control is called "bogus"`, hint}, ""},
		{run("--wan-express-cc", "bogus"), 2, []string{`invalid argument "bogus" for "--wan-express-cc"`, hint}, ""},
		{run("--lan-forward", "twice"), 2, []string{`invalid argument "twice" for "--lan-forward" flag: want chunked, pipelined`, hint}, ""},
		{run("--sites", dupSites), 2, []string{dupSites + ":3: 127.0.0.2 is given twice (first at " + dupSites + ":1)", hint}, ""},
		{run("--sites", badSites), 2, []string{badSites + `:1: want "<host-or-CIDR> <site>", got 3 fields`}, ""},
		{run("--sites", filepath.Join(dir, "nosites")), 2, []string{"--sites: open " + filepath.Join(dir, "nosites") + ": no such file or directory (want a readable file of \"<host-or-CIDR> <site>\" lines", hint}, ""},
		{[]string{"mpi5k", "run"}, 2, []string{"no launcher command given", hint}, ""},
		// One site: the launcher runs unchanged and its status is the wrapper's.
		{[]string{"mpi5k", "run", "--sites", oneSite, "--flavour", "mpich", exit7, "-hosts", "127.0.0.2,127.0.0.3"}, 7, []string{"every host is in site x"}, ""},

		// The other subcommands
		{[]string{"mpi5k", "trace", "report", "--frobnicate", dir}, 2, []string{"mpi5k trace report: unknown flag: --frobnicate", hint}, ""},
		{[]string{"mpi5k", "trace", "--help"}, 0, nil, "usage: mpi5k trace report"},
		{[]string{"mpi5k", "bench", "--frobnicate"}, 2, []string{"mpi5k bench: unknown flag: --frobnicate", hint}, ""},
		{[]string{"mpi5k", "bench", "--wan-conns", "-3"}, 2, []string{`invalid argument "-3" for "--wan-conns"`, hint}, ""},
		{[]string{"mpi5k", "bench", "--help"}, 0, nil, "usage: mpi5k bench"},
		// The demo's header says what it runs, and the demo keeps its WAN
		// conditions its own.
		{[]string{"mpi5k", "bench", "--demo", "--dry-run"}, 0, nil, "#   0.1 % random loss:       each WAN packet dropped at random with probability 0.001"},
		{[]string{"mpi5k", "bench", "--demo", "--dry-run"}, 0, nil, "#   one CUBIC flow each way: one bulk CUBIC flow (iperf3) per direction"},
		{[]string{"mpi5k", "bench", "--demo", "--dry-run", "--workloads", "bt,ft"}, 0, nil, "# mpi5k demo: workloads bt ft (size small, scale 0.5), 1 run(s) of each direct (no gateways) and through the gateways, under 3 WAN conditions"},
		{[]string{"mpi5k", "bench", "--demo", "--cross", "with"}, 2, []string{"mpi5k bench: --cross: --demo sets the WAN and the competing traffic of its conditions itself", hint}, ""},
		{[]string{"mpi5k", "bench", "--demo", "--cross-cc", "bbr"}, 2, []string{"mpi5k bench: --cross-cc: --demo sets", hint}, ""},
		{[]string{"mpi5k", "bench", "--size", "B"}, 2, []string{`mpi5k bench: --size "B": want small or A`, hint}, ""},
		{[]string{"mpi5k", "bench", "--compute", "spin"}, 2, []string{`mpi5k bench: --compute "spin": want work (the verdict`, hint}, ""},
		{[]string{"mpi5k", "bench", "--scale", "0", "--size", "A"}, 2, []string{"scale=0: must be > 0", hint}, ""},
		{[]string{"mpi5k", "bench", "--help"}, 0, nil, "isolating tools, not a verdict"},
		{[]string{"mpi5k", "sitemap", "check", "--frobnicate", goodMap}, 2, []string{"mpi5k sitemap check: unknown flag: --frobnicate", hint}, ""},
		{[]string{"mpi5k", "sitemap", "check", badMap}, 1, []string{badMap + ":1: site s1 has no gateway"}, ""},
		{[]string{"mpi5k", "sitemap", "--help"}, 0, nil, "usage: mpi5k sitemap check"},
		{[]string{"mpi5k", "lab", "up", "--frobnicate"}, 2, []string{"mpi5k lab up: unknown flag: --frobnicate", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--nodes", "0"}, 2, []string{"--nodes: need at least 1, got 0", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--mtu", "10"}, 2, []string{"--mtu: 10 out of range 576..9000", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--reorder", "fast"}, 2, []string{`--reorder: bad value "fast" (examples: 0.1%, 1%, 0.01)`, hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--reorder", "150%"}, 2, []string{`--reorder: "150%" out of range 0..100%`, hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--reorder", "1%", "--reorder-delay", "2s"}, 2, []string{"--reorder-delay: 2s out of range 0..1s", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--reorder-delay", "3ms"}, 2, []string{"--reorder-delay 3ms given without --reorder", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--seed", "-1"}, 2, []string{"--seed", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--gateways", "0"}, 2, []string{"--gateways: need 1..8 gateway hosts per site, got 0", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--gateways", "9"}, 2, []string{"--gateways: need 1..8 gateway hosts per site, got 9", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--gateways", "two"}, 2, []string{"--gateways", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--help"}, 0, nil, "--gateways int"},
		{[]string{"mpi5k", "lab", "up", "--lan-loss", "site9=1%"}, 2, []string{`--lan-loss: site "site9" is not one of the lab's sites [site1 site2]`, hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--lan-reorder", "site3=1%"}, 2, []string{`--lan-reorder: site "site3" is not one of the lab's sites [site1 site2]`, hint}, ""},
		{[]string{"mpi5k", "lab", "tamper", "--name", "nolab"}, 2, []string{"mpi5k lab tamper: --every N is required (or --stop)", hint}, ""},
		{[]string{"mpi5k", "lab", "tamper", "--every", "10", "--pair", "site1"}, 2, []string{`--pair "site1": want two sites, e.g. --pair site1,site2`, hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--lan-reorder-delay", "2ms"}, 2, []string{"--lan-reorder-delay: 2ms given without lan-reorder", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--lan-reorder", "1%", "--lan-reorder-delay", "3s"}, 2, []string{"--lan-reorder-delay: 3s out of range 0..1s", hint}, ""},
		{[]string{"mpi5k", "lab", "up", "--lan-loss", "site1=lots"}, 2, []string{`--lan-loss: bad value "lots" (examples: 0.1%, 1%, 0.01) (site site1)`, hint}, ""},
		{[]string{"mpi5k", "bench", "--cross-flows", "-2"}, 2, []string{`invalid argument "-2" for "--cross-flows" flag: flows -2 out of range 1..64`, hint}, ""},
		{[]string{"mpi5k", "bench", "--timeout", "-1s"}, 2, []string{`invalid argument "-1s" for "--timeout" flag: negative duration`, hint}, ""},
		{[]string{"mpi5k", "lab", "hosts", "--help"}, 0, nil, "--gateways"},
	} {
		name := strings.Join(tc.args, " ")
		name = strings.ReplaceAll(name, dir+"/", "")
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			cmd := exec.CommandContext(ctx, filepath.Join(bin, tc.args[0]), tc.args[1:]...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.Env = append(os.Environ(), "HOME="+dir)
			err := cmd.Run()
			cancel()
			status := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				status = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if status != tc.status {
				t.Errorf("%s: exit status %d, want %d\nstdout: %s\nstderr: %s", name, status, tc.status, stdout.String(), stderr.String())
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("%s: stderr lacks %q:\n%s", name, w, stderr.String())
				}
			}
			if tc.stdout != "" && !strings.Contains(stdout.String(), tc.stdout) {
				t.Errorf("%s: stdout lacks %q:\n%s", name, tc.stdout, stdout.String())
			}
			// A successful run prints nothing on stderr but the placement
			// note (these dry runs put each site's gateway on its rank host).
			rest := regexp.MustCompile(`(?m)^mpi5k: gateways share hosts with ranks .*\n`).ReplaceAllString(stderr.String(), "")
			if tc.status == 0 && tc.stdout != "" && rest != "" {
				t.Errorf("%s: stderr not empty: %s", name, stderr.String())
			}
		})
	}

	// Under OAR without --launcher oarsh the wrapper says what OAR jobs use.
	{
		var stderr bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, "mpi5k"), run()...)
		cmd.Args = append([]string{"mpi5k"}, run()[1:]...)
		cmd.Stderr = &stderr
		cmd.Env = append(os.Environ(), "HOME="+dir, "OAR_NODEFILE="+twoSites)
		if err := cmd.Run(); err != nil {
			t.Fatalf("dry run under OAR: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "$OAR_NODEFILE is set (an OAR job) and --launcher is ssh: OAR jobs usually reach their nodes with oarsh (mpi5k run --launcher oarsh") {
			t.Errorf("no oarsh hint under OAR:\n%s", stderr.String())
		}
		stderr.Reset()
		cmd = exec.Command(filepath.Join(bin, "mpi5k"), append([]string{"run", "--launcher", "oarsh"}, run()[2:]...)...)
		cmd.Stderr = &stderr
		cmd.Env = append(os.Environ(), "HOME="+dir, "OAR_NODEFILE="+twoSites)
		cmd.Run()
		if strings.Contains(stderr.String(), "usually reach their nodes with oarsh") {
			t.Errorf("oarsh hint with --launcher oarsh:\n%s", stderr.String())
		}
	}

	// A dry run asks no DNS (.invalid names never resolve) and leaves
	// nothing behind: no ~/.mpi5k/run-*, no temporary hostfile.
	tmp := t.TempDir()
	hosts := write("hosts", "node-1.lyon.invalid\nnode-2.lyon.invalid\nnode-1.rennes.invalid\nnode-2.rennes.invalid\n")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(bin, "mpi5k"), "run", "--dry-run", "--dedicated-gateways", "--wan-conns", "2",
		"mpirun", "-np", "2", "--hostfile", hosts, "./app")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HOME="+dir, "TMPDIR="+tmp)
	if err := cmd.Run(); err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr.String())
	}
	// No port given: the job draws one triple of 5000-5999.
	m := regexp.MustCompile(`site lyon id=1 lan=node-2.lyon.invalid:(5\d\d\d) wan=node-2.lyon.invalid:(5\d\d\d)\n`).FindStringSubmatch(stdout.String())
	if m == nil {
		t.Errorf("dry run output lacks lyon's site record with ports of 5000-5999:\n%s", stdout.String())
	} else {
		lan, _ := strconv.Atoi(m[1])
		wan, _ := strconv.Atoi(m[2])
		for _, want := range []string{
			fmt.Sprintf("--site rennes --metrics node-2.rennes.invalid:%d --exit-on-stdin-eof --ready-tag ", lan+2),
			" --wan-conns=2 --key KEYFILE\n", // the job's key, placed on the gateway host at the start
			"\nkey lyon ed25519:", "\nkey rennes ed25519:",
			"/hosts.0:\nnode-1.lyon.invalid\nnode-1.rennes.invalid\n",
		} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("dry run output lacks %q:\n%s", want, stdout.String())
			}
		}
		if wan != lan+1 || (lan-5000)%3 != 0 {
			t.Errorf("drawn ports lan %d wan %d: want a triple 5000+3k, +1, +2", lan, wan)
		}
	}
	for _, d := range []string{filepath.Join(dir, ".mpi5k"), tmp} {
		if ents, _ := os.ReadDir(d); len(ents) > 0 {
			t.Errorf("the dry runs left %s/%s behind", d, ents[0].Name())
		}
	}
}

// A user other than root may set only the congestion controls of
// net.ipv4.tcp_allowed_congestion_control: the gateway refuses the others
// at once, naming the sysctl and the fix.
func TestGatewayCCNotAllowed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the gateway as another user")
	}
	read := func(name string) []string {
		b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
		if err != nil {
			t.Skip(err)
		}
		return strings.Fields(string(b))
	}
	allowed := read("tcp_allowed_congestion_control")
	var cc string
	for _, a := range read("tcp_available_congestion_control") {
		if !slices.Contains(allowed, a) {
			cc = a
		}
	}
	if cc == "" {
		t.Skip("every available congestion control is allowed here")
	}
	bin := buildBinaries(t)
	for _, d := range []string{bin, filepath.Dir(bin)} { // t.TempDir's are 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(bin, "mpi5k-gateway"), "--map", "/nonexistent", "--site", "a", "--wan-cc", cc)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("as nobody, --wan-cc %s: %v, want exit status 2\n%s", cc, err, stderr.String())
	}
	want := fmt.Sprintf(`invalid argument %q for "--wan-cc" flag: congestion control %q: operation not permitted: net.ipv4.tcp_allowed_congestion_control is %q and this process lacks CAP_NET_ADMIN; fix: allow it on this host`,
		cc, cc, strings.Join(allowed, " "))
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
	}
}
