package e2e

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/testbed"
)

// TestGatewaySecure: gateways on the emulated grid with keys in the site
// map. Streams cross the WAN over TLS; a stream to a port outside
// --wan-allow-ports is refused by the destination's gateway (dst_port);
// a site1 gateway at site1's address with a key the map does not list is
// refused by site2's gateway (wan_auth) and never links.
func TestGatewaySecure(t *testing.T) {
	w := newWANLab(t, 10*time.Millisecond) // sink on :7001, echo on :7002
	l, ctx := w.l, w.ctx
	dir := t.TempDir()
	keys := map[string]string{}
	var extra strings.Builder
	for _, s := range []string{"site1", "site2", "impostor"} {
		keys[s] = filepath.Join(dir, s+".key")
		pub, err := gateway.GenerateKey(keys[s])
		if err != nil {
			t.Fatal(err)
		}
		if s != "impostor" {
			extra.WriteString("key " + s + " " + sitemap.FormatKey(pub) + "\n")
		}
	}
	base, err := os.ReadFile(l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	keyed := filepath.Join(dir, "keyed.map")
	if err := os.WriteFile(keyed, append(base, extra.String()...), 0o644); err != nil {
		t.Fatal(err)
	}
	// The impostor's own map lists its key for site1: it believes it is
	// site1, as a machine that took over site1's address would.
	pubImp, _ := gateway.LoadKey(keys["impostor"])
	forged := filepath.Join(dir, "forged.map")
	line1 := strings.SplitN(extra.String(), "\n", 2)[0]
	forgedText := strings.Replace(string(base)+extra.String(), line1,
		"key site1 "+sitemap.FormatKey(pubImp.Public().(ed25519.PublicKey)), 1)
	if err := os.WriteFile(forged, []byte(forgedText), 0o644); err != nil {
		t.Fatal(err)
	}

	start := func(site, mapPath, key string, wait bool) *exec.Cmd {
		return startSecureGW(t, w, dir, site, mapPath, key, wait, "--wan-allow-ports", "7001-7002")
	}
	site2, _ := w.m.Site("site2")
	refusals := func(reason string) float64 { return labRefusals(t, w, w.dstHost, site2.LAN.Addr(), reason) }
	g1 := start("site1", keyed, keys["site1"], false)
	start("site2", keyed, keys["site2"], true)

	// Encrypted data path: bulk counted by the sink (beside direct, for
	// the record: the machine is shared, so no bound is asserted), and
	// round trips.
	d := run(t, ctx, l, w.src, "send", w.sink, "-", "3")
	g := run(t, ctx, l, w.src, "send", w.sink, w.gwLAN, "3")
	if len(d) < 2 || len(g) < 2 || g[0] <= 0 {
		t.Fatalf("bulk direct %v, through the keyed gateways %v", d, g)
	}
	dr, gr := d[0]*8/d[1]/1e6, g[0]*8/g[1]/1e6
	t.Logf("bulk over 200 Mbit/s, RTT 10 ms: direct %.1f Mbit/s, keyed (TLS) gateways %.1f Mbit/s (%.1f %%)", dr, gr, 100*gr/dr)
	if v := run(t, ctx, l, w.src, "pingpong", w.echo, w.gwLAN, "20"); len(v) < 1 || v[0] <= 0 {
		t.Fatalf("round trips through the keyed gateways: %v", v)
	}

	// Destination policy: 7003 is outside 7001-7002.
	startServer(t, ctx, l, w.dstHost, "sink", strings.Replace(w.sink, ":7001", ":7003", 1))
	out, err := helper(t, ctx, l, w.src, "send", strings.Replace(w.sink, ":7001", ":7003", 1), w.gwLAN, "1").Output()
	if err == nil {
		t.Fatalf("a stream to port 7003, outside --wan-allow-ports 7001-7002, went through: %s", out)
	}
	if n := refusals("dst_port"); n != 1 {
		t.Fatalf("site2 counted %v dst_port refusals, want 1", n)
	}

	// An impostor at site1's address with a key the map does not list.
	g1.Process.Signal(os.Interrupt)
	g1.Wait()
	before := refusals("wan_auth")
	start("site1", forged, keys["impostor"], false)
	deadline := time.Now().Add(15 * time.Second)
	for refusals("wan_auth") < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("site2 counted %v wan_auth refusals, want at least %v", refusals("wan_auth"), before+2)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := helper(t, sctx, l, w.src, "pingpong", w.echo, w.gwLAN, "3").Output(); err == nil {
		t.Fatalf("round trips through an impostor gateway succeeded: %s", out)
	}
}

// startSecureGW runs bin/mpi5k-gateway for site in its lab host with
// mapPath and key ("" for none), metrics on 0.0.0.0:9105, the helper
// servers' ports allowed (args may narrow them), and waits for it to be
// ready if wait.
func startSecureGW(t *testing.T, w *wanLab, dir, site, mapPath, key string, wait bool, args ...string) *exec.Cmd {
	ready := filepath.Join(dir, site+strconv.FormatInt(time.Now().UnixNano(), 36)+".ready")
	argv := []string{"--map", mapPath, "--site", site, "--ready-file", ready, "--log-level", "warn", "--metrics", "0.0.0.0:9105",
		"--wan-allow-ports", helperPorts}
	if key != "" {
		argv = append(argv, "--key", key)
	}
	g := w.l.CommandContext(w.ctx, w.l.Gateway(site), gatewayBinary(t), append(argv, args...)...)
	g.Stderr = os.Stderr
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Process.Signal(os.Interrupt); g.Wait() })
	for deadline := time.Now().Add(15 * time.Second); wait; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway %s did not become ready", site)
		}
	}
	return g
}

// labRefusals reads mpi5k_refusals_total{reason} of the gateway at gw,
// scraped from host.
func labRefusals(t *testing.T, w *wanLab, host string, gw netip.Addr, reason string) float64 {
	n, err := refusalsOf(w, host, gw, reason)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// refusalsOf is labRefusals returning the scrape's error.
func refusalsOf(w *wanLab, host string, gw netip.Addr, reason string) (float64, error) {
	out, err := w.scrape(nil, host, gw)
	if err != nil {
		return 0, fmt.Errorf("gateway %v metrics: %v", gw, err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(dropSite(line), `mpi5k_refusals_total{reason="`+reason+`"} `); ok {
			x, _ := strconv.ParseFloat(v, 64)
			return x, nil
		}
	}
	return 0, nil
}

// TestGatewayNATByKey: site1's gateway (the dialer) sits behind source
// NAT: nftables in its namespace rewrites its WAN connections to
// 10.77.1.150, an address that is not the map's wan=. With keys site2
// accepts it by key and the pair links and carries streams; with the
// keyless map the same NAT is refused (wan_source), the control that
// shows the NAT is in effect. Then the other side: site2's gateway behind
// NAT (its connections rewritten to 10.77.2.150, nothing reaches its WAN
// port from outside) and nat=yes for site2 in the map: site2 dials, site1
// accepts it by key, and streams cross.
func TestGatewayNATByKey(t *testing.T) {
	w := newWANLab(t, 10*time.Millisecond)
	l, ctx := w.l, w.ctx
	dir := t.TempDir()
	site2, _ := w.m.Site("site2")
	const natAddr = "10.77.1.150"
	gw1 := l.Gateway("site1")
	for _, cmd := range [][]string{
		{"ip", "addr", "add", natAddr + "/24", "dev", "eth0"},
		{"nft", "add table ip mpi5knat"},
		{"nft", "add chain ip mpi5knat post { type nat hook postrouting priority srcnat ; policy accept ; }"},
		{"nft", "add rule ip mpi5knat post ip daddr " + site2.WAN.Addr().String() + " tcp dport " +
			strconv.Itoa(int(site2.WAN.Port())) + " snat to " + natAddr},
	} {
		if out, err := l.CommandContext(ctx, gw1, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v in %s: %v\n%s", cmd, gw1, err, out)
		}
	}
	keyed := filepath.Join(dir, "keyed.map")
	base, err := os.ReadFile(l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	text := string(base)
	keys := map[string]string{}
	for _, s := range []string{"site1", "site2"} {
		keys[s] = filepath.Join(dir, s+".key")
		pub, err := gateway.GenerateKey(keys[s])
		if err != nil {
			t.Fatal(err)
		}
		text += "key " + s + " " + sitemap.FormatKey(pub) + "\n"
	}
	if err := os.WriteFile(keyed, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}

	// Keyless: site2 sees a source that is no gateway and refuses it.
	g1 := startSecureGW(t, w, dir, "site1", l.SiteMapPath(), "", false)
	g2 := startSecureGW(t, w, dir, "site2", l.SiteMapPath(), "", false)
	// Neither gateway is waited for (no link comes up), so site2's
	// metrics may not listen yet: a failed scrape counts as no refusal
	// until the deadline.
	var scrapeErr error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var n float64
		n, scrapeErr = refusalsOf(w, w.dstHost, site2.LAN.Addr(), "wan_source")
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keyless: site2 did not refuse the NATed site1 gateway (wan_source): is the NAT in effect? (last scrape error: %v)", scrapeErr)
		}
	}
	for _, g := range []*exec.Cmd{g1, g2} {
		g.Process.Signal(os.Interrupt)
		g.Wait()
	}

	// Keyed: the same NAT, accepted by key.
	k2 := startSecureGW(t, w, dir, "site2", keyed, keys["site2"], false)
	k1 := startSecureGW(t, w, dir, "site1", keyed, keys["site1"], true)
	out, err := l.CommandContext(ctx, l.Gateway("site2"), "ss", "-tnH", "state", "established", "sport", "= :"+strconv.Itoa(int(site2.WAN.Port()))).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), natAddr+":") {
		t.Fatalf("site2's WAN connections do not come from %s:\n%s", natAddr, out)
	}
	if v := run(t, ctx, l, w.src, "pingpong", w.echo, w.gwLAN, "20"); len(v) < 1 || v[0] <= 0 {
		t.Fatalf("round trips through the NATed keyed pair: %v", v)
	}

	// The other side behind NAT: site1's gateway as it was; site2's
	// rewrites its connections to site1 and takes none from outside.
	for _, g := range []*exec.Cmd{k1, k2} {
		g.Process.Signal(os.Interrupt)
		g.Wait()
	}
	if out, err := l.CommandContext(ctx, gw1, "nft", "delete", "table", "ip", "mpi5knat").CombinedOutput(); err != nil {
		t.Fatalf("removing site1's NAT: %v\n%s", err, out)
	}
	site1, _ := w.m.Site("site1")
	const natAddr2 = "10.77.2.150"
	gw2 := l.Gateway("site2")
	wanPort := strconv.Itoa(int(site2.WAN.Port()))
	for _, cmd := range [][]string{
		{"ip", "addr", "add", natAddr2 + "/24", "dev", "eth0"},
		{"nft", "add table ip mpi5knat"},
		{"nft", "add chain ip mpi5knat post { type nat hook postrouting priority srcnat ; policy accept ; }"},
		{"nft", "add rule ip mpi5knat post ip daddr " + site1.WAN.Addr().String() + " tcp dport " +
			strconv.Itoa(int(site1.WAN.Port())) + " snat to " + natAddr2},
		{"nft", "add chain ip mpi5knat in { type filter hook input priority filter ; policy accept ; }"},
		{"nft", "add rule ip mpi5knat in ip saddr != 127.0.0.0/8 tcp dport " + wanPort + " ct state new drop"},
	} {
		if out, err := l.CommandContext(ctx, gw2, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v in %s: %v\n%s", cmd, gw2, err, out)
		}
	}
	natText := strings.Replace(text, "wan="+site2.WAN.String(), "wan="+site2.WAN.String()+" nat=yes", 1)
	if natText == text {
		t.Fatalf("no site2 wan=%v in the lab's map", site2.WAN)
	}
	natMap := filepath.Join(dir, "nat2.map")
	if err := os.WriteFile(natMap, []byte(natText), 0o644); err != nil {
		t.Fatal(err)
	}
	startSecureGW(t, w, dir, "site1", natMap, keys["site1"], false)
	startSecureGW(t, w, dir, "site2", natMap, keys["site2"], true)
	out, err = l.CommandContext(ctx, gw1, "ss", "-tnH", "state", "established", "sport", "= :"+strconv.Itoa(int(site1.WAN.Port()))).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), natAddr2+":") {
		t.Fatalf("site1's WAN connections do not come from site2's NAT address %s:\n%s", natAddr2, out)
	}
	if v := run(t, ctx, l, w.src, "pingpong", w.echo, w.gwLAN, "20"); len(v) < 1 || v[0] <= 0 {
		t.Fatalf("round trips with site2 behind NAT: %v", v)
	}
}

// keyedLabMap writes the lab's site map with a fresh key per site into
// dir; it returns the map's path and each site's key file.
func keyedLabMap(t *testing.T, w *wanLab, dir string) (string, map[string]string) {
	text, err := os.ReadFile(w.l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, s := range w.l.Sites() {
		keys[s] = filepath.Join(dir, s+".key")
		pub, err := gateway.GenerateKey(keys[s])
		if err != nil {
			t.Fatal(err)
		}
		text = append(text, "key "+s+" "+sitemap.FormatKey(pub)+"\n"...)
	}
	keyed := filepath.Join(dir, "keyed.map")
	if err := os.WriteFile(keyed, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return keyed, keys
}

// TestGatewayMITM: the lab's WAN emulator, as a man in the middle, flips
// a bit in 1 of every 200 data segments between the gateways (twice per
// direction), fixing the TCP checksum so the kernel accepts them, while
// checksummed streams cross. Keyed gateways detect each flip (a TLS
// record fails its tag), tear the link down and resume it: every stream
// arrives intact. Keyless gateways, the control, deliver the altered byte
// and a destination's checksum differs.
func TestGatewayMITM(t *testing.T) {
	w := newWANLab(t, 10*time.Millisecond)
	l, ctx := w.l, w.ctx
	dir := t.TempDir()
	keyed, keys := keyedLabMap(t, w, dir)
	sums := netip.AddrPortFrom(w.dst, 7005).String()
	startServer(t, ctx, l, w.dstHost, "sumserve", sums)
	site1, _ := w.m.Site("site1")
	site2, _ := w.m.Site("site2")
	resumes := func() float64 {
		var n float64
		for _, g := range []struct {
			host string
			gw   netip.Addr
		}{{w.src, site1.LAN.Addr()}, {w.dstHost, site2.LAN.Addr()}} {
			text, err := w.scrape(t, g.host, g.gw)
			if err != nil {
				t.Fatalf("gateway %v metrics: %v", g.gw, err)
			}
			n += metricSum(text, "mpi5k_wan_resumes_total")
		}
		return n
	}
	tampered := func() uint64 {
		st, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, ls := range st.Links {
			n += ls.Tampered
		}
		return n
	}
	pass := func(mapPath string, k1, k2 string) (string, error) {
		g2 := startSecureGW(t, w, dir, "site2", mapPath, k2, false)
		g1 := startSecureGW(t, w, dir, "site1", mapPath, k1, true)
		defer func() {
			for _, g := range []*exec.Cmd{g1, g2} {
				g.Process.Signal(os.Interrupt)
				g.Wait()
			}
		}()
		if err := l.Tamper(testbed.Tamper{Port: testbed.GatewayWANPort, Every: 200, Count: 2}); err != nil {
			t.Fatal(err)
		}
		defer l.Tamper(testbed.Tamper{})
		var out, errOut strings.Builder
		c := helper(t, ctx, l, w.src, "sumsend", sums, w.gwLAN, "24", strconv.Itoa(8<<20), "5")
		c.Stdout, c.Stderr = &out, &errOut
		err := c.Run()
		if n := tampered(); n == 0 {
			t.Fatalf("the emulator altered no segment (sumsend: %v %s)", err, errOut.String())
		}
		if mapPath == keyed && err == nil {
			// Read before the gateways stop.
			n := resumes()
			t.Logf("keyed: WAN links resumed %v times", n)
			if n < 1 {
				t.Errorf("keyed: %d segments altered and the links resumed %v times, want at least once", tampered(), n)
			}
		}
		t.Logf("%d segments altered; sumsend: %s%s", tampered(), out.String(), errOut.String())
		return errOut.String(), err
	}
	if msg, err := pass(keyed, keys["site1"], keys["site2"]); err != nil {
		t.Fatalf("keyed: a stream failed with bits flipped on the WAN: %v\n%s", err, msg)
	}
	msg, err := pass(l.SiteMapPath(), "", "")
	if err == nil || !strings.Contains(msg, "checksum mismatch") {
		t.Fatalf("keyless control: want a stream whose checksum differs, got %v\n%s", err, msg)
	}
}

// TestGatewaySecureBulk measures bulk over the emulated WAN (200 Mbit/s,
// RTT 20 ms) direct, through keyless gateways, through keyed ones with
// encrypted records and with integrity-only ones, alternating, MPI5K_SECURE_BULK rounds of MPI5K_BULK_SECS (3) s
// each; a measurement, not run by default (bench/figures/security).
func TestGatewaySecureBulk(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("MPI5K_SECURE_BULK"))
	if rounds < 1 {
		t.Skip("a measurement: set MPI5K_SECURE_BULK=N rounds")
	}
	secs := "3"
	if v := os.Getenv("MPI5K_BULK_SECS"); v != "" {
		secs = v
	}
	w := newWANLab(t, 20*time.Millisecond)
	dir := t.TempDir()
	text, err := os.ReadFile(w.l.SiteMapPath())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, s := range []string{"site1", "site2"} {
		keys[s] = filepath.Join(dir, s+".key")
		pub, err := gateway.GenerateKey(keys[s])
		if err != nil {
			t.Fatal(err)
		}
		text = append(text, "key "+s+" "+sitemap.FormatKey(pub)+"\n"...)
	}
	keyed := filepath.Join(dir, "keyed.map")
	if err := os.WriteFile(keyed, text, 0o644); err != nil {
		t.Fatal(err)
	}
	rate := func(gw string) float64 {
		v := run(t, w.ctx, w.l, w.src, "send", w.sink, gw, secs)
		if len(v) < 2 {
			t.Fatalf("send: %v", v)
		}
		return v[0] * 8 / v[1] / 1e6
	}
	through := func(keyedMap bool, flags ...string) (float64, [2]time.Duration) {
		mp, k1, k2 := w.l.SiteMapPath(), "", ""
		if keyedMap {
			mp, k1, k2 = keyed, keys["site1"], keys["site2"]
		}
		flags = append([]string{"--wan-cc", "bbr"}, flags...)
		g2 := startSecureGW(t, w, dir, "site2", mp, k2, false, flags...)
		g1 := startSecureGW(t, w, dir, "site1", mp, k1, true, flags...)
		c1, c2 := procCPU(g1.Process.Pid), procCPU(g2.Process.Pid)
		r := rate(w.gwLAN)
		cpu := [2]time.Duration{procCPU(g1.Process.Pid) - c1, procCPU(g2.Process.Pid) - c2}
		for _, g := range []*exec.Cmd{g1, g2} {
			g.Process.Signal(os.Interrupt)
			g.Wait()
		}
		return r, cpu
	}
	for i := range rounds {
		d := rate("-")
		plain, pc := through(false)
		enc, ec := through(true)
		integ, ic := through(true, "--wan-encrypt=false")
		t.Logf("round %d: Mbit/s direct %.1f, keyless gateways %.1f (%.1f %%, CPU s %v), keyed encrypted %.1f (%.1f %%, %v), keyed integrity-only %.1f (%.1f %%, %v)",
			i+1, d, plain, 100*plain/d, pc, enc, 100*enc/d, ec, integ, 100*integ/d, ic)
	}
}

// procCPU is the user+system time process pid has used.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond // USER_HZ = 100
}
