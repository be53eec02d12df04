package wrap

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

// handMap is a hand-written map of the test sites: nets, gateways with
// separate LAN and WAN addresses, and ready= for the sites in ready.
func handMap(t *testing.T, ready map[string]string) string {
	t.Helper()
	text := ""
	for i, s := range []string{"site1", "site2"} {
		text += fmt.Sprintf("site %s id=%d lan=127.0.%d.2:5000 wan=127.1.%d.2:5001", s, i+1, i+1, i+1)
		if r := ready[s]; r != "" {
			text += " ready=" + r
		}
		text += fmt.Sprintf("\nnet %s 127.0.%d.0/24\nhost %s gw.%s 127.0.%d.2 127.1.%d.2\n", s, i+1, s, s, i+1, i+1)
	}
	return writeFile(t, t.TempDir(), "sites.map", text)
}

// --map FILE: hosts placed by the map's nets, each site's gateway started
// on the host record holding its lan= address, the map's own listeners.
func TestRunMapDryRun(t *testing.T) {
	c, out, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,node-1.site2", "-n", "2", "./pp")
	c.DryRun, c.MapFile = true, handMap(t, nil)
	c.Resolve = nil // a dry run resolves nothing: node names are in no host record
	if code, err := Run(context.Background(), c); code != 2 || err == nil || !strings.Contains(err.Error(), "add `host <site> node-1.site1 <addr>`") {
		t.Fatalf("unresolved host in a dry run: %d %v", code, err)
	}
	c, out, _ = testConfig(t, "mpiexec.mpich", "-hosts", "127.0.1.11,127.0.2.11", "-n", "2", "./pp")
	c.DryRun, c.MapFile = true, handMap(t, nil)
	// A site the job does not use stays out of the job's map: its
	// gateway need not run.
	b, _ := os.ReadFile(c.MapFile)
	os.WriteFile(c.MapFile, append(b, "site site3 id=3 lan=127.0.3.2:5000 wan=127.1.3.2:5001\nnet site3 127.0.3.0/24\n"...), 0o644)
	code, err := Run(context.Background(), c)
	if code != 0 || err != nil {
		t.Fatal(code, err)
	}
	if strings.Contains(out.String(), "site3") {
		t.Errorf("the job's map names site3, which the job does not use:\n%s", out.String())
	}
	for _, want := range []string{
		"site site1 id=1 lan=127.0.1.2:5000 wan=127.1.1.2:5001\n",
		"gw.site2 " + c.GatewayBin + " --map " + c.WorkDir + "/sites.conf --site site2 --metrics 127.0.2.2:",
		"mpiexec.mpich -genv LD_PRELOAD " + c.Preload + " -genv MPI5K_MAP " + c.WorkDir + "/sites.conf",
		// No running gateway: the job's own ones get keys.
		"\nkey site1 ed25519:", "\nkey site2 ed25519:", " --key KEYFILE",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out.String())
		}
	}
}

// A keyed --map whose site has no running gateway: mpi5k run holds no
// site key, so it refuses to start a gateway for it.
func TestRunMapKeyedNeedsServiceGateways(t *testing.T) {
	c, _, _ := testConfig(t, "mpiexec.mpich", "-hosts", "127.0.1.11,127.0.2.11", "-n", "2", "./pp")
	c.MapFile, c.Resolve = handMap(t, nil), LiteralResolver
	b, _ := os.ReadFile(c.MapFile)
	os.WriteFile(c.MapFile, append(b, "key site1 "+sitemap.FormatKey(ed25519.PublicKey(strings.Repeat("a", 32)))+
		"\nkey site2 "+sitemap.FormatKey(ed25519.PublicKey(strings.Repeat("b", 32)))+"\n"...), 0o644)
	code, err := Run(context.Background(), c)
	if code != 1 || err == nil || !strings.Contains(err.Error(), "lists gateway keys and site site1, site site2 has no running gateway") {
		t.Errorf("keyed map without running gateways: %d %v", code, err)
	}
}

func TestRunMapErrors(t *testing.T) {
	c, _, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,other", "./pp")
	c.MapFile = handMap(t, nil)
	code, err := Run(context.Background(), c)
	if code != 2 || err == nil || !strings.Contains(err.Error(), "host other (127.0.3.1) is in no site of --map "+c.MapFile+": add a `net <site> <cidr>`") {
		t.Errorf("host in no site: %d %v", code, err)
	}
	c.SitesFile = writeFile(t, t.TempDir(), "sites", "127.0.0.0/8 a\n")
	if code, err := Run(context.Background(), c); code != 2 || err == nil || !strings.Contains(err.Error(), "give one") {
		t.Errorf("--map with --sites: %d %v", code, err)
	}
	c.SitesFile = ""
	c.MapFile = writeFile(t, t.TempDir(), "bad.map", "site a id=1 lan=10.0.0.1:1\n")
	if code, err := Run(context.Background(), c); code != 2 || err == nil || !strings.Contains(err.Error(), "--map: "+c.MapFile+":1:") {
		t.Errorf("bad map: %d %v", code, err)
	}
}

// A site whose map record has ready= and whose gateway answers there is
// served by that gateway: the run starts no gateway of its own.
func TestRunMapUsesRunningGateways(t *testing.T) {
	f := newFakeGateways(t)
	dir := t.TempDir()
	launched := filepath.Join(dir, "launched")
	c := failfastConfig(t, f, "echo \"$*\" >> "+launched+"\nexec sleep 300", "echo \"MPI5K_MAP=$4\"; exit 0")
	c.MapFile = handMap(t, map[string]string{"site1": fmt.Sprintf("127.0.1.2:%d", f.port), "site2": fmt.Sprintf("127.0.2.2:%d", f.port)})
	var errb strings.Builder
	c.Stderr = &errb
	code, err, _ := runBounded(t, c, 20*time.Second)
	if code != 0 || err != nil {
		t.Fatalf("code %d err %v\n%s", code, err, errb.String())
	}
	for _, want := range []string{"site site1: using its running gateway", "site site2: using its running gateway", "through the running gateways of site site1, site site2"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if b, err := os.ReadFile(launched); err == nil {
		t.Errorf("gateways launched although both run:\n%s", b)
	}

	// site2's gateway is down: the run starts one for site2 only.
	errb.Reset()
	c.MapFile = handMap(t, map[string]string{"site1": fmt.Sprintf("127.0.1.2:%d", f.port), "site2": "127.0.2.2:1"})
	c.MetricsPort = f.port
	code, err, _ = runBounded(t, c, 20*time.Second)
	if code != 0 || err != nil {
		t.Fatalf("code %d err %v\n%s", code, err, errb.String())
	}
	b, _ := os.ReadFile(launched)
	if got := strings.Count(string(b), "--site"); got != 1 || !strings.Contains(string(b), "--site site2") {
		t.Errorf("launched %d gateways, want site2's only:\n%s", got, b)
	}
	if !strings.Contains(errb.String(), "site site2: its gateway does not answer at ready=127.0.2.2:1") {
		t.Errorf("stderr lacks why site2 gets a gateway:\n%s", errb.String())
	}
}

// TestJobMapGateways: a site's further gateway hosts stay in the job's
// map when its gateways run as a service, and are left out when the job
// starts the site's one gateway itself.
func TestJobMapGateways(t *testing.T) {
	m, err := sitemap.Parse(strings.NewReader(`site a id=1 lan=10.0.1.1:5000 wan=10.1.1.1:5001
gateway a lan=10.0.1.2:5000 wan=10.1.1.2:5001
site b id=2 lan=10.0.2.1:5000 wan=10.1.2.1:5001
gateway b lan=10.0.2.2:5000 wan=10.1.2.2:5001
net a 10.0.1.0/24
net b 10.0.2.0/24
`), "t.map")
	if err != nil {
		t.Fatal(err)
	}
	jm, err := jobMap(m, m.Sites(), map[string]bool{"a": true})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := jm.Site("a")
	b, _ := jm.Site("b")
	if len(a.Gateways) != 2 || len(b.Gateways) != 1 {
		t.Fatalf("job map: site a has %d gateways (want 2, a service), b %d (want 1, started by the job):\n%s", len(a.Gateways), len(b.Gateways), jm)
	}
}

// A job whose sites all run their gateways needs neither the gateway
// binary nor, with a shared workdir, the launcher; one that starts a
// gateway needs both.
func TestCheckTools(t *testing.T) {
	c, _, _ := testConfig(t, "sh", "./pp")
	c.fillDefaults()
	c.Launcher = []string{"no-such-launcher"}
	c.GatewayBin = "/nonexistent/mpi5k-gateway"
	if err := c.checkTools(nil, false); err != nil {
		t.Errorf("every site served by its running gateway: %v", err)
	}
	if err := c.checkTools([]*Site{{Name: "site1"}}, false); err == nil || !strings.Contains(err.Error(), "no-such-launcher") {
		t.Errorf("a gateway to start through a missing launcher: %v", err)
	}
	c.Launcher = []string{"sh"}
	if err := c.checkTools([]*Site{{Name: "site1"}}, false); err == nil || !strings.Contains(err.Error(), c.GatewayBin) {
		t.Errorf("a gateway to start without its binary: %v", err)
	}
	c.NodeBin = "/nonexistent/mpi5k"
	if err := c.checkTools(nil, true); err == nil || !strings.Contains(err.Error(), c.NodeBin) {
		t.Errorf("node daemons without their binary: %v", err)
	}
}
