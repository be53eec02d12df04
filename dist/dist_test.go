package dist

import (
	"bytes"
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
		files = append(files, fi.Mode().Perm().String()+" /"+rel)
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
	out, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && !strings.HasPrefix(f[0], "d") {
			if f[1] != "root/root" {
				t.Errorf("%s owned by %s, want root/root", f[5], f[1])
			}
			got = append(got, f[0]+" "+strings.TrimPrefix(f[5], "."))
		}
	}
	// The install list under /usr, Debian's copyright and changelog in
	// place of LICENSE, the unit in /lib, and the lintian overrides.
	var want []string
	for _, f := range installed {
		f = strings.Replace(f, "/usr/local/", "/usr/", 1)
		f = strings.Replace(f, "/usr/lib/systemd/", "/lib/systemd/", 1)
		if !strings.HasSuffix(f, "/LICENSE") {
			want = append(want, f)
		}
	}
	want = append(want, "-rw-r--r-- /usr/share/doc/mpi5k/copyright", "-rw-r--r-- /usr/share/doc/mpi5k/changelog.gz",
		"-rw-r--r-- /usr/share/lintian/overrides/mpi5k")
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
		regexp.QuoteMeta(strings.TrimSpace(string(arch))) + `\nDepends: libc6, procps\n$`).Match(info) {
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
	out, err = exec.Command("lintian", "--tag-display-limit", "0", deb).CombinedOutput()
	var tags []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "W: ") {
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
