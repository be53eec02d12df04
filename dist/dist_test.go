package dist

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
)

// make runs make in the repository's top directory.
func runMake(t *testing.T, args ...string) string {
	t.Helper()
	c := exec.Command("make", append([]string{"-s", "-C", ".."}, args...)...)
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// tree lists the regular files under root as "mode path" lines, sorted.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		mode := fi.Mode().Perm().String()
		if fi.Mode()&os.ModeSymlink != 0 {
			mode = "l" + mode[1:]
		}
		files = append(files, mode+" /"+rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	return files
}

// The files `make install` puts under PREFIX=/usr/local and /etc, as the
// operations guide lists them.
var installed = []string{
	"-rw-r--r-- /etc/mpi5k/gateway.env",
	"-rw-r--r-- /etc/mpi5k/sites.map.example",
	"-rwxr-xr-x /usr/local/bin/mpi5k",
	"-rwxr-xr-x /usr/local/bin/mpi5k-gateway",
	"-rwxr-xr-x /usr/local/bin/mpirun-wrap",
	"-rwxr-xr-x /usr/local/lib/mpi5k/keep-warm",
	"-rw-r--r-- /usr/local/lib/mpi5k/libmpi5k.so",
	"-rw-r--r-- /usr/local/lib/systemd/system/mpi5k-gateway.service",
	"-rw-r--r-- /usr/local/share/bash-completion/completions/mpi5k",
	"lrwxrwxrwx /usr/local/share/bash-completion/completions/mpi5k-gateway",
	"lrwxrwxrwx /usr/local/share/bash-completion/completions/mpirun-wrap",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-bench.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-doctor.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-gateway.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-lab.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-node.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-run.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-sitemap.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpi5k-trace.1",
	"-rw-r--r-- /usr/local/share/man/man1/mpirun-wrap.1",
	"-rw-r--r-- /usr/local/share/zsh/vendor-completions/_mpi5k",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/LICENSE",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/README.md",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/examples/mx.conf",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/examples/prometheus/grafana-dashboard.json",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/examples/prometheus/mpi5k.rules.yml",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/examples/prometheus/prometheus.yml",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/operations.md",
	"-rw-r--r-- /usr/local/share/doc/mpi5k/sitemap-format.md",
}

func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	runMake(t, "install", "DESTDIR="+dest)
	want := slices.Sorted(slices.Values(installed))
	if got := tree(t, dest); !slices.Equal(got, want) {
		t.Fatalf("make install DESTDIR=%s put\n%s\nwant\n%s", dest, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	unit, _ := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/mpi5k-gateway.service"))
	for _, want := range []string{"ExecStart=/usr/local/bin/mpi5k-gateway --map ${MPI5K_MAP}",
		"ExecStartPre=+/usr/local/lib/mpi5k/keep-warm start", "ExecStopPost=+/usr/local/lib/mpi5k/keep-warm stop",
		"EnvironmentFile=/etc/mpi5k/gateway.env", "ExecReload=/bin/kill -HUP $MAINPID"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("installed unit lacks %q", want)
		}
	}
	if regexp.MustCompile(`@[A-Z]+@`).Match(unit) {
		t.Errorf("installed unit keeps a placeholder:\n%s", unit)
	}
	if m, err := sitemap.Load(filepath.Join(dest, "etc/mpi5k/sites.map.example")); err != nil || len(m.Sites()) != 2 {
		t.Errorf("installed sites.map.example: %v", err)
	}
	// The installed mpi5k finds the installed library as its default.
	out, _ := exec.Command(filepath.Join(dest, "usr/local/bin/mpi5k"), "run", "--help").CombinedOutput()
	if want := filepath.Join(dest, "usr/local/lib/mpi5k/libmpi5k.so"); !strings.Contains(string(out), want) {
		t.Errorf("installed mpi5k run's default --preload is not %s:\n%s", want, out)
	}
	// A second install keeps the site's configuration.
	env := filepath.Join(dest, "etc/mpi5k/gateway.env")
	os.WriteFile(env, []byte("MPI5K_SITE=nancy\n"), 0o644)
	runMake(t, "install", "DESTDIR="+dest)
	if b, _ := os.ReadFile(env); string(b) != "MPI5K_SITE=nancy\n" {
		t.Errorf("make install over a configured host replaced gateway.env with:\n%s", b)
	}
}

// verifyUnit runs systemd-analyze verify and the offline security review
// on a unit whose commands exist on this host.
func verifyUnit(t *testing.T, unit string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed (apt-get install systemd): unit not verified")
		return
	}
	if out, err := exec.Command("systemd-analyze", "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=yes", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`).FindSubmatch(out)
	if err != nil || m == nil || string(m[2]) != "OK" {
		t.Errorf("systemd-analyze security: %v, want an OK exposure level:\n%s", err, out)
	} else {
		t.Logf("unit exposure level %s %s", m[1], m[2])
	}
}

// The unit verifies with the paths of an install under a prefix of its own
// (verify wants every command to exist).
func TestUnitVerifies(t *testing.T) {
	root := t.TempDir()
	runMake(t, "install", "PREFIX="+root+"/usr", "SYSCONFDIR="+root+"/etc")
	unit := root + "/usr/lib/systemd/system/mpi5k-gateway.service"
	verifyUnit(t, unit)
	// With the MX drop-in from the examples, as an admin installs it.
	if err := os.MkdirAll(unit+".d", 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(root + "/usr/share/doc/mpi5k/examples/mx.conf")
	if err != nil {
		t.Fatalf("make install left no MX drop-in: %v", err)
	}
	if err := os.WriteFile(unit+".d/mx.conf", b, 0o644); err != nil {
		t.Fatal(err)
	}
	verifyUnit(t, unit)
}

func TestDeb(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed: make deb needs Debian's dpkg")
	}
	deb := filepath.Join(t.TempDir(), "mpi5k.deb")
	runMake(t, "deb", "DEB="+deb)
	// Reproducible: the same commit builds the same bytes.
	again := filepath.Join(t.TempDir(), "mpi5k.deb")
	runMake(t, "deb", "DEB="+again)
	if a, b := sha256File(t, deb), sha256File(t, again); a != b {
		out, _ := exec.Command("sh", "-c", "cmp -l "+deb+" "+again+" | head").CombinedOutput()
		t.Errorf("make deb twice from one commit: sha256 %s, then %s\n%s", a, b, out)
	}
	out, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 8 && strings.HasPrefix(f[0], "l") && f[6] == "->" {
			f = f[:6] // a symbolic link: name -> target
		}
		if len(f) == 6 && !strings.HasPrefix(f[0], "d") {
			if f[1] != "root/root" {
				t.Errorf("%s owned by %s, want root/root", f[5], f[1])
			}
			got = append(got, f[0]+" "+strings.TrimPrefix(f[5], "."))
		}
	}
	// The install list under /usr, Debian's copyright and changelog in
	// place of LICENSE, the third-party notices, the unit in /lib.
	var want []string
	for _, f := range installed {
		f = strings.Replace(f, "/usr/local/", "/usr/", 1)
		f = strings.Replace(f, "/usr/lib/systemd/", "/lib/systemd/", 1)
		switch {
		case strings.HasSuffix(f, "/LICENSE"):
		case strings.Contains(f, "/man/man1/mpirun-wrap.1"):
			want = append(want, "lrwxrwxrwx /usr/share/man/man1/mpirun-wrap.1.gz") // to mpi5k-run.1.gz
		case strings.Contains(f, "/man/man1/"):
			want = append(want, f+".gz") // gzip -9n, as Debian's policy wants
		default:
			want = append(want, f)
		}
	}
	want = append(want, "-rw-r--r-- /usr/share/doc/mpi5k/copyright", "-rw-r--r-- /usr/share/doc/mpi5k/changelog.gz",
		"-rw-r--r-- /usr/share/doc/mpi5k/THIRD-PARTY-NOTICES.gz", "-rw-r--r-- /usr/share/doc/mpi5k/CHANGELOG.md")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("dpkg-deb -c:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	info, err := exec.Command("dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends").Output()
	if err != nil {
		t.Fatal(err)
	}
	arch, _ := exec.Command("dpkg", "--print-architecture").Output()
	if !regexp.MustCompile(`^Package: mpi5k\nVersion: \d+\.\d+\.\d+(~git\d{14}\.[0-9a-f]{7,})?\nArchitecture: ` +
		regexp.QuoteMeta(strings.TrimSpace(string(arch))) + `\nDepends: libc6 \(>= 2\.\d+\), procps\n$`).Match(info) {
		t.Errorf("dpkg-deb -f:\n%s", info)
	}
	ctl := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-e", deb, ctl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -e: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(ctl, "conffiles")); string(b) != "/etc/mpi5k/gateway.env\n/etc/mpi5k/sites.map.example\n" {
		t.Errorf("conffiles:\n%s", b)
	}

	// The packaged unit verifies once its /usr paths point into the
	// unpacked package.
	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, out)
	}
	unit, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system/mpi5k-gateway.service"))
	unit = bytes.ReplaceAll(unit, []byte("=/usr/"), []byte("="+root+"/usr/"))
	unit = bytes.ReplaceAll(unit, []byte("=+/usr/"), []byte("=+"+root+"/usr/"))
	p := filepath.Join(t.TempDir(), "mpi5k-gateway.service")
	os.WriteFile(p, unit, 0o644)
	verifyUnit(t, p)

	if _, err := exec.LookPath("lintian"); err != nil {
		t.Log("lintian not installed (apt-get install lintian): package not checked")
		return
	}
	// --pedantic, and no override: the man pages are real ones.
	out, err = exec.Command("lintian", "--pedantic", "--tag-display-limit", "0", deb).CombinedOutput()
	var tags []string
	for _, l := range strings.Split(string(out), "\n") {
		if len(l) > 3 && strings.Contains("EWP", l[:1]) && l[1:3] == ": " {
			tags = append(tags, l)
		}
	}
	if err != nil || len(tags) > 0 {
		t.Errorf("lintian: %v\n%s", err, out)
	}
}

// keep-warm in a network namespace of the test's own (the sysctl is per
// namespace): start saves and zeroes, a second start (a restart whose stop
// did not run) keeps the host's saved value, stop restores it once.
func TestKeepWarmScript(t *testing.T) {
	ns := testnet.Netns(t, "mpi5k-kw", "a")[0]
	saved := filepath.Join(t.TempDir(), "saved")
	script, _ := filepath.Abs("keep-warm")
	const sysctl = "/proc/sys/net/ipv4/tcp_slow_start_after_idle"
	in := func(args ...string) string {
		c := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
		c.Env = append(os.Environ(), "MPI5K_KEEP_WARM_SAVED="+saved)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	value := func() string { return in("cat", sysctl) }
	for i, step := range []struct{ cmd, want string }{
		{"start", "0"}, {"start", "0"}, {"stop", "1"}, {"stop", "1"},
	} {
		in(script, step.cmd)
		if v := value(); v != step.want {
			t.Fatalf("step %d (%s): sysctl %s, want %s", i, step.cmd, v, step.want)
		}
	}
	// Without keep-warm the host's value is left alone.
	c := exec.Command("ip", "netns", "exec", ns, script, "start")
	c.Env = append(os.Environ(), "MPI5K_KEEP_WARM_SAVED="+saved, "MPI5K_KEEP_WARM=no")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if v := value(); v != "1" {
		t.Errorf("MPI5K_KEEP_WARM=no: sysctl %s, want 1 untouched", v)
	}
}

// TestPrometheusFiles: the shipped rules, their tests and the example
// configuration pass promtool (gateway's TestMonitoringFiles checks their
// metric names against a running gateway).
func TestPrometheusFiles(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not installed (scripts/deps.sh installs Debian's prometheus)")
		}
		t.Skip("promtool not installed: apt-get install prometheus")
	}
	for _, args := range [][]string{
		{"check", "rules", "mpi5k.rules.yml"},
		{"check", "config", "prometheus.yml"},
		{"test", "rules", "mpi5k.rules.test.yml"},
	} {
		c := exec.Command(promtool, args...)
		c.Dir = "prometheus"
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestManPagesAndCompletion: the installed man pages and completions
// list every flag the installed commands declare (their --help and
// --help-advanced), man renders each page without a warning, and bash
// completes each command's subcommands and flags.
func TestManPagesAndCompletion(t *testing.T) {
	for _, tool := range []string{"help2man", "man", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
	dest := t.TempDir()
	runMake(t, "install", "DESTDIR="+dest)
	bin := filepath.Join(dest, "usr/local/bin")
	man := filepath.Join(dest, "usr/local/share/man/man1")
	flagRe := regexp.MustCompile(`(?:^|[\s\[])(--[a-z][a-z0-9-]*)`)
	flagsOf := func(args ...string) []string {
		var all []string
		for _, h := range []string{"--help", "--help-advanced"} {
			out, _ := exec.Command(filepath.Join(bin, args[0]), append(args[1:], h)...).CombinedOutput()
			if h == "--help-advanced" && strings.Contains(string(out), "unknown flag") {
				continue
			}
			for _, m := range flagRe.FindAllStringSubmatch(string(out), -1) {
				all = append(all, m[1])
			}
		}
		slices.Sort(all)
		return slices.Compact(all)
	}
	complete := func(words ...string) []string {
		script := fmt.Sprintf(`PATH=%s:$PATH; source %s; COMP_WORDS=(%s); COMP_CWORD=%d; _mpi5k; printf '%%s\n' "${COMPREPLY[@]}"`,
			bin, filepath.Join(dest, "usr/local/share/bash-completion/completions/mpi5k"), shellQuote(words), len(words)-1)
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("bash completion of %q: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	render := func(page string) string {
		c := exec.Command("man", "--warnings", "-l", filepath.Join(man, page+".1"))
		c.Env = append(os.Environ(), "MANWIDTH=100", "LC_ALL=C.UTF-8")
		var stderr strings.Builder
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("man %s: %v\n%s", page, err, stderr.String())
		}
		// Join words the renderer hyphenated or wrapped.
		return strings.ReplaceAll(strings.ReplaceAll(string(out), "‐\n", ""), "\u2010", "-")
	}
	cmds, _ := exec.Command(filepath.Join(bin, "mpi5k"), "--help").Output()
	var subs []string
	inList := false
	for _, l := range strings.Split(string(cmds), "\n") {
		switch {
		case l == "commands:":
			inList = true
		case inList && strings.HasPrefix(l, "  "):
			subs = append(subs, strings.Fields(l)[0])
		case inList:
			inList = false
		}
	}
	if len(subs) < 7 {
		t.Fatalf("mpi5k --help lists %d commands: %q", len(subs), subs)
	}
	if got := complete("mpi5k", ""); !slices.Equal(got, slices.Sorted(slices.Values(subs))) {
		t.Errorf("completion of mpi5k's commands: %q, want %q", got, subs)
	}
	pages := map[string][]string{"mpi5k-gateway": {"mpi5k-gateway"}}
	for _, s := range subs {
		if s != "version" {
			pages["mpi5k-"+s] = []string{"mpi5k", s}
		}
	}
	for page, cmd := range pages {
		text := render(page)
		flags := flagsOf(cmd...)
		if len(flags) == 0 && page != "mpi5k-lab" && page != "mpi5k-trace" && page != "mpi5k-sitemap" {
			t.Errorf("%q declares no flag?", cmd)
		}
		// Commands with commands of their own: each one's flags.
		for _, w := range complete(append(slices.Clone(cmd), "")...) {
			if !strings.HasPrefix(w, "-") && page != "mpi5k-gateway" && !strings.Contains(w, "/") && page != "mpi5k-run" {
				if _, err := os.Stat(w); err == nil {
					continue // a file the completion offered
				}
				flags = append(flags, flagsOf(append(slices.Clone(cmd), w)...)...)
			}
		}
		slices.Sort(flags)
		flags = slices.Compact(flags)
		for _, f := range flags {
			if f == "--help" || f == "--help-advanced" && page != "mpi5k-gateway" && page != "mpi5k-run" {
				continue
			}
			if !strings.Contains(text, f) {
				t.Errorf("man %s lacks %s", page, f)
			}
		}
		if len(cmd) == 1 || cmd[1] == "run" || cmd[1] == "bench" || cmd[1] == "doctor" {
			got := complete(append(slices.Clone(cmd), "--")...)
			for _, f := range flagsOf(cmd...) {
				if !slices.Contains(got, f) {
					t.Errorf("completion of %s --: lacks %s", strings.Join(cmd, " "), f)
				}
			}
		}
	}
	// mpirun-wrap's page is mpi5k run's.
	if b, err := os.ReadFile(filepath.Join(man, "mpirun-wrap.1")); err != nil || string(b) != ".so man1/mpi5k-run.1\n" {
		t.Errorf("mpirun-wrap.1: %q, %v", b, err)
	}
	if zsh, err := exec.LookPath("zsh"); err == nil {
		f := filepath.Join(dest, "usr/local/share/zsh/vendor-completions/_mpi5k")
		if out, err := exec.Command(zsh, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("zsh -n %s: %v\n%s", f, err, out)
		}
	}
}

func shellQuote(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
