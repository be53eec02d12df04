package wrap

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

func TestPickPorts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[int]bool{}
	for range 2000 {
		p := pickPorts(r, 0, 0, 0)
		if p.lan < PortsFrom || p.metrics > PortsTo || p.wan != p.lan+1 || p.metrics != p.lan+2 || (p.lan-PortsFrom)%3 != 0 {
			t.Fatalf("drawn %+v: want a triple base, base+1, base+2 with base = %d+3k, within %d-%d", p, PortsFrom, PortsFrom, PortsTo)
		}
		seen[p.lan] = true
	}
	if len(seen) < 250 {
		t.Errorf("2000 draws gave only %d different triples", len(seen))
	}
	for range 200 {
		p := pickPorts(r, 0, 0, 5002)
		if p.metrics != 5002 || p.lan == 5002 || p.wan == 5002 {
			t.Fatalf("with --metrics-port 5002: %+v", p)
		}
	}
}

// A gateway that cannot bind its port (another job's holds it) makes the
// run draw other ports and start again; the job then runs.
func TestRunRedrawsTakenPorts(t *testing.T) {
	f := newFakeGateways(t)
	f.state[1].Store(gwLinkDown)
	dir := t.TempDir()
	tried := filepath.Join(dir, "tried")
	c := failfastConfig(t, f, "if [ $site = site2 ] && [ ! -e "+tried+" ]; then touch "+tried+
		"; echo 'gateway: LAN listener: listen tcp: bind: address already in use'; exit 1; fi\nexec sleep 300", "exit 0")
	c.LANPort, c.WANPort, c.Keep = 0, 0, true
	var errb strings.Builder
	c.Stderr = &errb
	go func() {
		for {
			if _, err := os.Stat(tried); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The retry starts after the first gateways stopped (seconds).
		time.Sleep(300 * time.Millisecond)
		f.state[1].Store(gwReady)
	}()
	code, err, _ := runBounded(t, c, 30*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("code %d err %v\n%s", code, err, errb.String())
	}
	m := regexp.MustCompile(`a gateway port of (\d+), (\d+), \d+ is in use on a gateway host; drawing others`).FindStringSubmatch(errb.String())
	if m == nil {
		t.Fatalf("no message about the port in use:\n%s", errb.String())
	}
	sm, err := sitemap.Load(filepath.Join(c.WorkDir, "sites.conf"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sm.Site("site1")
	if first, _ := strconv.Atoi(m[1]); int(s.LAN.Port()) == first {
		t.Errorf("the map after the retry keeps the taken LAN port %d", first)
	}
}
