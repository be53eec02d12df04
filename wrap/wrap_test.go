package wrap

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/sitemap"
)

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDetectFlavour(t *testing.T) {
	for name, want := range map[string]Flavour{
		"mpirun.openmpi": OpenMPI, "/usr/bin/orterun": OpenMPI, "mpiexec.openmpi": OpenMPI,
		"prterun": PRRTE, "mpiexec.mpich": Hydra, "/opt/x/mpiexec.hydra": Hydra, "mpirun.mpich": Hydra,
	} {
		got, err := DetectFlavour(name)
		if err != nil || got != want {
			t.Errorf("DetectFlavour(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	// Generic names resolve through Debian's alternatives symlinks.
	dir := t.TempDir()
	real := writeFile(t, dir, "mpirun.openmpi", "#!/bin/sh\n")
	if err := os.Symlink(real, filepath.Join(dir, "mpirun")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "mpiexec.hydra", "#!/bin/sh\n")
	if err := os.Symlink(filepath.Join(dir, "mpiexec.hydra"), filepath.Join(dir, "mpiexec")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	t.Setenv("I_MPI_ROOT", "")
	if f, err := DetectFlavour("mpirun"); err != nil || f != OpenMPI {
		t.Errorf("mpirun -> %v, %v", f, err)
	}
	if f, err := DetectFlavour("mpiexec"); err != nil || f != Hydra {
		t.Errorf("mpiexec -> %v, %v", f, err)
	}
	if _, err := DetectFlavour("nosuchmpirun"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing launcher: %v", err)
	}
	writeFile(t, dir, "launch", "#!/bin/sh\n")
	if _, err := DetectFlavour("launch"); err == nil || !strings.Contains(err.Error(), "--flavour") {
		t.Errorf("unknown launcher: %v", err)
	}
}

func TestHostsFromArgs(t *testing.T) {
	dir := t.TempDir()
	ompiFile := writeFile(t, dir, "ompi", "# comment\nnode-1.lyon slots=2 max_slots=4\nnode-2.lyon\n\nnode-1.rennes slots=1 # trailing\n")
	hydraFile := writeFile(t, dir, "hydra", "node-1.lyon:2\nnode-1.rennes:3:eth0\nnode-1.lyon\n")
	cases := []struct {
		name string
		f    Flavour
		argv []string
		want []Host
	}{
		{"ompi hostfile", OpenMPI, []string{"mpirun", "-np", "4", "--hostfile", ompiFile, "./app"},
			[]Host{{"node-1.lyon", 2}, {"node-2.lyon", 0}, {"node-1.rennes", 1}}},
		{"ompi machinefile + H, mca pairs", OpenMPI, []string{"mpirun", "--mca", "btl", "tcp,self", "-machinefile", ompiFile, "-H", "x-1.nancy:2,x-2.nancy", "./app", "-H", "ignored"},
			[]Host{{"node-1.lyon", 2}, {"node-2.lyon", 0}, {"node-1.rennes", 1}, {"x-1.nancy", 2}, {"x-2.nancy", 0}}},
		{"ompi --host=", OpenMPI, []string{"mpirun.openmpi", "--allow-run-as-root", "--host=a-1.s1,a-1.s2", "hostname"},
			[]Host{{"a-1.s1", 0}, {"a-1.s2", 0}}},
		{"ompi unknown boolean before program", OpenMPI, []string{"mpirun", "--oversubscribe", "./app", "--host", "x-1.y"}, nil},
		{"hydra -f", Hydra, []string{"mpiexec", "-n", "4", "-genv", "UCX_TLS", "tcp,self", "-f", hydraFile, "./app"},
			[]Host{{"node-1.lyon", 2}, {"node-1.rennes", 3}}},
		{"hydra -hosts", Hydra, []string{"mpiexec.mpich", "-hosts", "a-1.s1:2,a-1.s2", "-n", "3", "prog"},
			[]Host{{"a-1.s1", 2}, {"a-1.s2", 0}}},
		{"intel -machinefile", IntelMPI, []string{"mpirun", "-perhost", "1", "-machinefile", hydraFile, "prog"},
			[]Host{{"node-1.lyon", 2}, {"node-1.rennes", 3}}},
		{"none", OpenMPI, []string{"mpirun", "-np", "2", "./app"}, nil},
	}
	for _, c := range cases {
		got, _, err := HostsFromArgs(c.f, c.argv)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	for _, bad := range []struct {
		argv []string
		want string
	}{
		{[]string{"mpirun", "--hostfile", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"mpirun", "-H", "a,,b", "./x"}, "empty host name"},
		{[]string{"mpirun", "-H", "a:zero", "./x"}, "bad slot count"},
		{[]string{"mpirun", "-H", "bad$name", "./x"}, "invalid host name"},
		{[]string{"mpirun", "--hostfile"}, "needs a value"},
	} {
		if _, _, err := HostsFromArgs(OpenMPI, bad.argv); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: err %v, want %q", bad.argv, err, bad.want)
		}
	}
	badSlots := writeFile(t, dir, "badslots", "a slots=x\n")
	if _, _, err := HostsFromArgs(OpenMPI, []string{"mpirun", "--hostfile", badSlots}); err == nil || !strings.Contains(err.Error(), badSlots+":1") {
		t.Errorf("bad slots: %v", err)
	}
}

func TestHostsFromBatch(t *testing.T) {
	dir := t.TempDir()
	oar := writeFile(t, dir, "oar", "graphene-1.nancy.grid5000.fr\ngraphene-1.nancy.grid5000.fr\nparavance-3.rennes.grid5000.fr\n")
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	hs, src, err := HostsFromBatch(env(map[string]string{"OAR_NODEFILE": oar}))
	if err != nil || src.Option != "$OAR_NODEFILE" {
		t.Fatal(err, src)
	}
	if want := []Host{{"graphene-1.nancy.grid5000.fr", 2}, {"paravance-3.rennes.grid5000.fr", 1}}; !reflect.DeepEqual(hs, want) {
		t.Errorf("OAR: %v", hs)
	}
	if hs, _, err := HostsFromBatch(env(map[string]string{"PBS_NODEFILE": oar})); err != nil || len(hs) != 2 {
		t.Errorf("PBS: %v %v", hs, err)
	}
	old := lookPath
	lookPath = func(string) (string, error) { return "", os.ErrNotExist } // no scontrol
	defer func() { lookPath = old }()
	hs, _, err = HostsFromBatch(env(map[string]string{"SLURM_JOB_NODELIST": "g-[1-2,05].nancy,h-7.rennes"}))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Host{{"g-1.nancy", 0}, {"g-2.nancy", 0}, {"g-05.nancy", 0}, {"h-7.rennes", 0}}; !reflect.DeepEqual(hs, want) {
		t.Errorf("Slurm: %v", hs)
	}
	if _, _, err := HostsFromBatch(env(map[string]string{"SLURM_JOB_NODELIST": "g-[1-2"})); err == nil {
		t.Error("unbalanced Slurm list accepted")
	}
	if hs, src, err := HostsFromBatch(env(nil)); hs != nil || src != nil || err != nil {
		t.Error("no batch system should give nothing")
	}
}

func TestExpandHostlist(t *testing.T) {
	got, err := expandHostlist("n[01-03]-[a]x,m,k[8,10]")
	if err == nil {
		t.Fatalf("letters in a range accepted: %v", got)
	}
	got, err = expandHostlist("n[01-03],m,k[8,10].s")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"n01", "n02", "n03", "m", "k8.s", "k10.s"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v", got)
	}
	got, err = expandHostlist("r[1-2]c[1-2]")
	if err != nil || !reflect.DeepEqual(got, []string{"r1c1", "r1c2", "r2c1", "r2c2"}) {
		t.Errorf("two brackets: %v %v", got, err)
	}
	for _, bad := range []string{"a]", "a,,b", "n[3-1]", "n[]"} {
		if _, err := expandHostlist(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fakeResolver gives each host a loopback address, so nothing leaves the
// machine even when a test polls a gateway.
func fakeResolver(addrs map[string]string) Resolver {
	return func(_ context.Context, h string) ([]netip.Addr, error) {
		a, ok := addrs[h]
		if !ok {
			return nil, fmt.Errorf("no such host")
		}
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
}

var labAddrs = map[string]string{
	"node-1.site1": "127.0.1.11", "node-2.site1": "127.0.1.12", "gw.site1": "127.0.1.2",
	"node-1.site2": "127.0.2.11", "node-2.site2": "127.0.2.12", "gw.site2": "127.0.2.2",
	"other": "127.0.3.1", "gw2.site1": "127.0.1.3",
}

func TestMakePlan(t *testing.T) {
	ctx := context.Background()
	hosts := []Host{{"node-1.site2", 1}, {"node-1.site1", 1}, {"node-2.site1", 1}, {"node-2.site2", 1}}
	p, err := MakePlan(ctx, hosts, PlanOptions{Resolve: fakeResolver(labAddrs)})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sites) != 2 || p.Sites[0].Name != "site1" || p.Sites[0].ID != 1 || p.Sites[1].ID != 2 {
		t.Fatalf("sites %+v", p.Sites)
	}
	// Default gateway: the last host of each site's list.
	if p.Sites[0].Gateway.Name != "node-2.site1" || p.Sites[1].Gateway.Name != "node-2.site2" {
		t.Errorf("gateways %s %s", p.Sites[0].Gateway.Name, p.Sites[1].Gateway.Name)
	}
	text := p.MapText(5000, 5001)
	m, err := sitemap.Parse(strings.NewReader(text), "plan")
	if err != nil {
		t.Fatalf("map does not parse: %v\n%s", err, text)
	}
	if s, ok := m.Lookup(netip.MustParseAddr("127.0.2.11")); !ok || s.Name != "site2" {
		t.Errorf("lookup node-1.site2: %v %v", s, ok)
	}
	if s, _ := m.Site("site1"); s.LAN.String() != "127.0.1.12:5000" || s.WAN.String() != "127.0.1.12:5001" {
		t.Errorf("site1 gateway %v %v", s.LAN, s.WAN)
	}

	// Lab-style gateways from the environment; sites not in the job ignored.
	p, err = MakePlan(ctx, hosts, PlanOptions{Resolve: fakeResolver(labAddrs),
		EnvGateways: map[string]string{"site1": "gw.site1", "site2": "gw.site2", "site9": "gw.site9"}})
	if err != nil || p.Sites[0].Gateway.Name != "gw.site1" || p.Sites[1].Gateway.Addrs[0].String() != "127.0.2.2" {
		t.Fatalf("env gateways: %v %+v", err, p)
	}
	if _, err := MakePlan(ctx, hosts, PlanOptions{Resolve: fakeResolver(labAddrs), Gateways: map[string]string{"site9": "gw.site1"}}); err == nil ||
		!strings.Contains(err.Error(), "no host of the job is in site site9") {
		t.Errorf("explicit gateway of an unknown site: %v", err)
	}

	// --sites rules by name and by CIDR.
	dir := t.TempDir()
	rules, err := ReadSiteRules(writeFile(t, dir, "sites", "other east # by name\n127.0.1.0/24 west\n127.0.2.11 east\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err = MakePlan(ctx, []Host{{"node-1.site1", 0}, {"node-1.site2", 0}, {"other", 0}}, PlanOptions{Resolve: fakeResolver(labAddrs), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	if p.Sites[0].Name != "east" || len(p.Sites[0].Hosts) != 2 || p.Sites[1].Name != "west" {
		t.Errorf("rules: %+v %+v", p.Sites[0], p.Sites[1])
	}

	for _, bad := range []struct {
		hosts []Host
		o     PlanOptions
		want  string
	}{
		{[]Host{{"other", 0}}, PlanOptions{}, "host other is in no site"},
		{[]Host{{"node-9.site1", 0}}, PlanOptions{}, "cannot resolve host node-9.site1"},
		{[]Host{{"other", 0}, {"node-1.site1", 0}}, PlanOptions{Rules: rules[1:]}, "host other (127.0.3.1) is in no site"},
		{[]Host{{"node-1.site1", 0}, {"node-1.site2", 0}}, PlanOptions{Dedicated: true}, "leaves no host for ranks"},
	} {
		bad.o.Resolve = fakeResolver(labAddrs)
		if _, err := MakePlan(ctx, bad.hosts, bad.o); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: err %v, want %q", bad.hosts, err, bad.want)
		}
	}
	for text, want := range map[string]string{
		"a b c\n":                      "sites:1: want",
		"10.0.0.1/33 x":                "bad CIDR",
		"bad$ x":                       "invalid host name",
		"# nothing\n":                  "no rules",
		"gw x\n# again\ngw y\n":        "sites:3: gw is given twice (first at " + dir + "/sites:1)",
		"10.0.0.0/8 x\n10.1.2.3/8 y\n": "sites:2: 10.1.2.3/8 is given twice (first at " + dir + "/sites:1)",
		"10.0.0.1 x\n10.0.0.1/32 x\n":  "sites:2: 10.0.0.1/32 is given twice",
	} {
		if _, err := ReadSiteRules(writeFile(t, dir, "sites", text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rules %q: %v, want %q", text, err, want)
		}
	}
}

// A site map the plan cannot make is reported against the user's input
// (the host list and --sites), not the workdir's file.
func TestRunMapErrorNamesInput(t *testing.T) {
	c, _, _ := testConfig(t, "mpirun.openmpi", "-H", "node-1.site1,node-1.site2", "./a")
	c.Resolve = fakeResolver(map[string]string{"node-1.site1": "127.0.1.11", "node-1.site2": "127.0.1.11"})
	c.Getenv = func(string) string { return "" }
	code, err := Run(context.Background(), c)
	if code != 1 || err == nil || !strings.HasPrefix(err.Error(), "the site map built from the host list:") ||
		!strings.Contains(err.Error(), "overlaps host node-1.site1") || !strings.HasSuffix(err.Error(), "(hosts from -H)") ||
		strings.Contains(err.Error(), c.WorkDir) {
		t.Errorf("status %d, %v", code, err)
	}
}

// A dry run asks no resolver for names and writes nothing.
func TestRunDryRunUnresolved(t *testing.T) {
	c, out, _ := testConfig(t, "mpirun.openmpi", "-H", "node-1.site1,node-2.site1,node-1.site2,10.9.0.1", "./a")
	c.Resolve, c.DryRun, c.Dedicated = nil, true, true
	c.Getenv = func(string) string { return "" }
	c.SitesFile = writeFile(t, t.TempDir(), "sites", "10.9.0.0/16 site2\nnode-1.site1 site1\nnode-2.site1 site1\nnode-1.site2 site2\n")
	code, err := Run(context.Background(), c)
	if code != 0 || err != nil {
		t.Fatal(code, err)
	}
	for _, want := range []string{
		"# a dry run resolves no host names",
		"site site1 id=1 lan=node-2.site1:5000 wan=node-2.site1:5001\nhost site1 node-2.site1 node-2.site1\nhost site1 node-1.site1 node-1.site1\n",
		"site site2 id=2 lan=10.9.0.1:5000 wan=10.9.0.1:5001\n",
		" -H node-1.site1,node-1.site2 ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(c.WorkDir); err == nil {
		t.Errorf("dry run created %s", c.WorkDir)
	}
}

func TestParseGateways(t *testing.T) {
	m := map[string]string{}
	if err := ParseGateways(m, "site1=gw.site1, site2=gw.site2"); err != nil || m["site2"] != "gw.site2" {
		t.Fatal(err, m)
	}
	for _, bad := range []string{"site1", "=x", "s=", ",x"} {
		if err := ParseGateways(m, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// Several gateway hosts of a site: listed after SITE=, or repeated.
	if err := ParseGateways(m, "site1=gw2,gw3,site2=gw.site2"); err != nil || m["site1"] != "gw.site1,gw2,gw3" || m["site2"] != "gw.site2" {
		t.Fatal(err, m)
	}
	if err := ParseGateways(m, "site1=gw3"); err != nil || m["site1"] != "gw.site1,gw2,gw3" {
		t.Fatal("a host named again:", err, m)
	}
	many := "s=h0"
	for i := 1; i <= sitemap.MaxGateways; i++ {
		many += fmt.Sprintf(",h%d", i)
	}
	if err := ParseGateways(map[string]string{}, many); err == nil {
		t.Errorf("%d gateway hosts for a site accepted", sitemap.MaxGateways+1)
	}
}

// TestRunDryRunTwoGateways: --gateway site1=gw.site1,gw2.site1 writes a
// gateway record for the second host and starts a gateway on each host,
// each told its listeners.
func TestRunDryRunTwoGateways(t *testing.T) {
	c, out, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,node-1.site2", "-n", "2", "./pp")
	c.DryRun = true
	c.Gateways = map[string]string{}
	if err := ParseGateways(c.Gateways, "site1=gw.site1,gw2.site1"); err != nil {
		t.Fatal(err)
	}
	code, err := Run(context.Background(), c)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	s := out.String()
	for _, want := range []string{
		"site site1 id=1 lan=127.0.1.2:5000 wan=127.0.1.2:5001\ngateway site1 lan=127.0.1.3:5000 wan=127.0.1.3:5001\n",
		"host site1 gw2.site1 127.0.1.3",
		"gw.site1 " + c.GatewayBin + " --map " + c.WorkDir + "/sites.conf --site site1 --metrics 127.0.1.2:5002 --exit-on-stdin-eof",
		"--lan 127.0.1.2:5000 --wan 127.0.1.2:5001",
		"gw2.site1 " + c.GatewayBin + " --map " + c.WorkDir + "/sites.conf --site site1 --metrics 127.0.1.3:5002 --exit-on-stdin-eof",
		"--lan 127.0.1.3:5000 --wan 127.0.1.3:5001",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, s)
		}
	}
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, "--site site2 ") && strings.Contains(line, "--lan") {
			t.Errorf("site2 has one gateway, whose command needs no --lan: %s", line)
		}
	}
}

func TestInjectCommand(t *testing.T) {
	in := Inject{Preload: "/p/libmpi5k.so", Map: "/w/sites.conf", Env: map[string]string{"MPI5K_TRACE": "/t"}}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	got, err := in.Command(OpenMPI, []string{"mpirun.openmpi", "-np", "2", "./a"}, env(map[string]string{"LD_PRELOAD": "/x.so"}))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"mpirun.openmpi", "-x", "LD_PRELOAD=/p/libmpi5k.so:/x.so", "-x", "MPI5K_MAP=/w/sites.conf",
		"-x", "GODEBUG=asyncpreemptoff=1", "-x", "MPI5K_TRACE=/t", "-np", "2", "./a"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("openmpi:\n got %q\nwant %q", got, want)
	}
	got, _ = in.Command(Hydra, []string{"mpiexec.mpich", "-n", "2", "./a"}, env(map[string]string{"GODEBUG": "x=1"}))
	want = []string{"mpiexec.mpich", "-genv", "LD_PRELOAD", "/p/libmpi5k.so", "-genv", "MPI5K_MAP", "/w/sites.conf",
		"-genv", "GODEBUG", "x=1,asyncpreemptoff=1", "-genv", "MPI5K_TRACE", "/t", "-n", "2", "./a"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hydra:\n got %q\nwant %q", got, want)
	}
	if _, err := in.Command(nil, []string{"x"}, env(nil)); err == nil {
		t.Error("unknown flavour accepted")
	}
}

func TestWithoutHosts(t *testing.T) {
	dir := t.TempDir()
	hf := writeFile(t, dir, "hf", "a-1.s1 slots=2\na-2.s1\nb-1.s2\nb-2.s2 slots=1\n")
	argv := []string{"mpirun", "--hostfile", hf, "-H", "c-1.s3,c-2.s3:2", "./app"}
	hosts, src, err := HostsFromArgs(OpenMPI, argv)
	if err != nil {
		t.Fatal(err)
	}
	drop := map[string]bool{"a-2.s1": true, "b-2.s2": true, "c-2.s3": true}
	out, err := WithoutHosts(OpenMPI, argv, hosts, src, drop, dir)
	if err != nil {
		t.Fatal(err)
	}
	if out[1] != "--hostfile" || out[3] != "-H" || out[4] != "c-1.s3" || out[5] != "./app" {
		t.Fatalf("argv %q", out)
	}
	b, _ := os.ReadFile(out[2])
	if string(b) != "a-1.s1 slots=2\nb-1.s2\n" {
		t.Errorf("filtered hostfile %q", b)
	}
	// Hosts from the batch system: a hostfile option is added.
	out, err = WithoutHosts(Hydra, []string{"mpiexec", "-n", "2", "x"}, []Host{{"a", 2}, {"b", 0}}, nil, map[string]bool{"b": true}, dir)
	if err != nil || out[1] != "-f" || out[3] != "-n" {
		t.Fatalf("batch: %q %v", out, err)
	}
	if b, _ := os.ReadFile(out[2]); string(b) != "a:2\n" {
		t.Errorf("batch hostfile %q", b)
	}
	if _, err := WithoutHosts(OpenMPI, []string{"mpirun", "-H", "a", "x"}, []Host{{"a", 0}}, []HostSource{{Option: "-H", ArgIdx: 1}}, map[string]bool{"a": true}, dir); err == nil {
		t.Error("dropping every host accepted")
	}
}

func testConfig(t *testing.T, argv ...string) (Config, *bytes.Buffer, *bytes.Buffer) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	return Config{
		Argv: argv, Resolve: fakeResolver(labAddrs), Stdout: &out, Stderr: &errb,
		GatewayBin: writeFile(t, dir, "mpi5k-gateway", "#!/bin/sh\n"),
		Preload:    writeFile(t, dir, "libmpi5k.so", ""),
		WorkDir:    filepath.Join(dir, "work"), SharedFS: true,
		LANPort: 5000, WANPort: 5001, MetricsPort: 5002,
		Getenv: func(k string) string { return map[string]string{"MPI5K_GATEWAYS": "site1=gw.site1,site2=gw.site2"}[k] },
	}, &out, &errb
}

func TestRunDryRun(t *testing.T) {
	c, out, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,node-1.site2", "-n", "2", "./pp")
	c.SharedFS = false
	c.DryRun = true
	c.Launcher = []string{"oarsh"}
	code, err := Run(context.Background(), c)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	s := out.String()
	for _, want := range []string{
		"site site1 id=1 lan=127.0.1.2:5000 wan=127.0.1.2:5001",
		"oarsh gw.site2 " + c.GatewayBin + " --map " + c.WorkDir + "/sites.conf --site site2 --metrics 127.0.2.2:5002 --exit-on-stdin-eof",
		"oarsh node-1.site2 'mkdir -p ",
		"mpiexec.mpich -genv LD_PRELOAD " + c.Preload + " -genv MPI5K_MAP " + c.WorkDir + "/sites.conf",
		"\nkey site1 ed25519:", "\nkey site2 ed25519:",
		"--ready-tag ", " --key KEYFILE",
		"oarsh gw.site2 'sh -c '\\''umask 077 && f=$(mktemp",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "PRIVATE KEY") {
		t.Errorf("a dry run printed a private key:\n%s", s)
	}
}

func TestRunSingleSiteRunsUnchanged(t *testing.T) {
	fake := writeFile(t, t.TempDir(), "mpiexec.hydra", "#!/bin/sh\nexit 3\n")
	c, _, errb := testConfig(t, fake, "-hosts", "node-1.site1,node-2.site1", "./app")
	code, err := Run(context.Background(), c)
	if err != nil || code != 3 {
		t.Fatalf("exit status %d, %v (want mpirun's 3)", code, err)
	}
	if !strings.Contains(errb.String(), "every host is in site site1") {
		t.Errorf("no note: %q", errb.String())
	}
}

func TestRunErrors(t *testing.T) {
	c, _, _ := testConfig(t, "mpirun.openmpi", "-H", "node-1.site1,node-1.site2", "./a")
	c.GatewayBin = "/nonexistent/mpi5k-gateway"
	if _, err := Run(context.Background(), c); err == nil || !strings.Contains(err.Error(), "/nonexistent/mpi5k-gateway") {
		t.Errorf("missing gateway binary: %v", err)
	}
	c, _, _ = testConfig(t, "mpirun.openmpi", "-np", "2", "./a")
	if _, err := Run(context.Background(), c); err == nil || !strings.Contains(err.Error(), "no host list") {
		t.Errorf("no hosts: %v", err)
	}
}

// A gateway that never becomes ready: the wrapper must fail naming the
// site, and leave nothing running.
func TestRunGatewayNeverReady(t *testing.T) {
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	// The fake launcher stands for "ssh HOST mpi5k-gateway ...": it records
	// its pid and sleeps like a gateway that never reaches its peer.
	// The sixth field of /proc/PID/stat is the sid setsid gives: every
	// gateway launcher must have its own (see gateway.start).
	launcher := writeFile(t, dir, "fake-ssh", runOthers+"echo $$ $(cut -d' ' -f6 /proc/$$/stat) >> "+pidfile+"\nexec sleep 300\n")
	c, _, _ := testConfig(t, "sh", "-hosts", "node-1.site1,node-1.site2", "-c", "exit 0")
	c.Flavour = Hydra
	c.Launcher = []string{launcher}
	c.ReadyTimeout = time.Second
	c.MetricsPort = 1 // nothing listens on loopback port 1
	start := time.Now()
	code, err := Run(context.Background(), c)
	if err == nil || code == 0 || !strings.Contains(err.Error(), "not ready") || !strings.Contains(err.Error(), "site site1") {
		t.Fatalf("code %d err %v", code, err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("took %v", d)
	}
	b, _ := os.ReadFile(pidfile)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("launcher ran %d times: %q", len(lines), b)
	}
	ours, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		var pid, sid int
		if _, err := fmt.Sscan(l, &pid, &sid); err != nil {
			t.Fatalf("pid file line %q: %v", l, err)
		}
		if sid != pid || sid == ours {
			t.Errorf("gateway launcher %d has sid %d (ours %d), want its own (setsid)", pid, sid, ours)
		}
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("gateway launcher %d still running", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestRunGatewayExitsEarly(t *testing.T) {
	dir := t.TempDir()
	launcher := writeFile(t, dir, "fake-ssh", runOthers+"echo 'mpi5k-gateway: --wan-cc: unknown congestion control' >&2\nexit 2\n")
	c, _, _ := testConfig(t, "sh", "-hosts", "node-1.site1,node-1.site2", "-c", "exit 0")
	c.Flavour = Hydra
	c.Launcher = []string{launcher}
	c.ReadyTimeout = 5 * time.Second
	c.MetricsPort = 1
	_, err := Run(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "unknown congestion control") {
		t.Fatalf("err %v", err)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"a/b-c.d": "a/b-c.d", "a b": "'a b'", "it's": `'it'\''s'`, "": "''"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every flavour is found by its commands and its --flavour spellings, and
// --flavour's help and errors list them all.
func TestFlavourNaming(t *testing.T) {
	for _, f := range flavours {
		n := f.naming()
		for _, c := range n.commands {
			if got, err := DetectFlavour("/usr/bin/" + c); err != nil || got != f {
				t.Errorf("DetectFlavour(%s) = %v, %v; want %v", c, got, err, f)
			}
		}
		for _, s := range n.spellings {
			if got, err := ParseFlavour(strings.ToUpper(s)); err != nil || got != f {
				t.Errorf("ParseFlavour(%s) = %v, %v; want %v", s, got, err, f)
			}
		}
	}
	if got, want := FlavourHelp(), "openmpi, prrte, mpich, intel, slurm for srun"; got != want {
		t.Errorf("FlavourHelp() = %q, want %q", got, want)
	}
	_, err := ParseFlavour("LAM")
	if want := `unknown MPI flavour "LAM" (want openmpi, prrte, mpich, intel or slurm)`; err == nil || err.Error() != want {
		t.Errorf("ParseFlavour(LAM): %v, want %s", err, want)
	}
}
