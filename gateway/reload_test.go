package gateway

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway/degraded"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tuning"
)

var (
	gwC    = netip.MustParseAddr("127.3.0.1")
	nodeC  = netip.MustParseAddr("127.3.0.10")
	nodeB2 = netip.MustParseAddr("127.22.0.10") // in a net only a reload adds to b
)

// threeSites is a map of a, b and c (c only if withC), with b's extra net
// 127.22.0.0/16 if withNet; the listeners are those of base.
func threeSites(t *testing.T, base *sitemap.Map, withC, withNet bool) *sitemap.Map {
	t.Helper()
	b := sitemap.NewBuilder()
	for _, s := range base.Sites() {
		if s.Name == "c" && !withC {
			continue
		}
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
		b.AddNet(s.Name, netip.PrefixFrom(s.LAN.Addr(), 16).Masked())
	}
	if withNet {
		b.AddNet("b", netip.MustParsePrefix("127.22.0.0/16"))
	}
	m, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// gatedStream opens a checksummed stream from src to dst through gw,
// sends half of size bytes, and returns a function that sends the rest
// once called and reports whether the SumServer's SHA-256 matched.
func gatedStream(t *testing.T, gw netip.AddrPort, src netip.Addr, dst netip.AddrPort, size int, seed uint64) func() error {
	t.Helper()
	c, err := lanOpen(gw, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 1))
	h := sha256.New()
	send := func(n int) error {
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := min(n, len(buf))
			testnet.Fill(r, buf[:k])
			h.Write(buf[:k])
			if _, err := c.Write(buf[:k]); err != nil {
				return err
			}
			n -= k
		}
		return nil
	}
	if err := send(size / 2); err != nil {
		t.Fatalf("first half to %v: %v", dst, err)
	}
	return func() error {
		defer c.Close()
		if err := send(size - size/2); err != nil {
			return fmt.Errorf("second half to %v: %w", dst, err)
		}
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			return fmt.Errorf("checksum from %v: %w", dst, err)
		}
		if !bytes.Equal(got, h.Sum(nil)) {
			return fmt.Errorf("stream to %v: checksum mismatch (got %d bytes)", dst, len(got))
		}
		return nil
	}
}

func linksTo(g *testGW, site string) int {
	n := 0
	for _, l := range g.allLinks() {
		if l.Peer().Name == site {
			n++
		}
	}
	return n
}

// TestReload: a reload mid-transfer loses no stream. It takes site c out
// of a's and b's maps (the stream a->c already running drains and ends
// intact, then a's links to c close and a refuses new streams to c), adds a
// net to b (reachable at once), refuses to move a's own listeners (the old
// map stays), and puts c back (the mesh to c re-forms).
func TestReload(t *testing.T) {
	base := func() *sitemap.Map {
		m := testMap(t)
		b := sitemap.NewBuilder()
		for _, s := range m.Sites() {
			b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
		}
		b.AddSite("c", 3, netip.AddrPortFrom(gwC, freePort(t, gwC)), netip.AddrPortFrom(gwC, freePort(t, gwC)))
		m3, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return m3
	}()
	m1 := threeSites(t, base, true, false)
	var gws []*testGW
	for _, s := range []string{"a", "b", "c"} {
		gws = append(gws, startGW(t, m1, s, func(c *Config) { c.RetireTimeout = 20 * time.Second }))
	}
	a, b := gws[0], gws[1]
	for _, g := range gws {
		select {
		case <-g.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("mesh did not come up")
		}
	}
	sumB := testnet.Serve(t, nodeB, testnet.SumServer)
	sumC := testnet.Serve(t, nodeC, testnet.SumServer)
	sumB2 := testnet.Serve(t, nodeB2, testnet.SumServer)
	const size = 4 << 20
	var rest []func() error
	for i := range 4 {
		rest = append(rest, gatedStream(t, a.LANAddr(), nodeA, sumB, size, uint64(i)))
	}
	toC := gatedStream(t, a.LANAddr(), nodeA, sumC, size, 9)
	if s, err := lanOpen(a.LANAddr(), nodeA, sumB2); err == nil {
		expectReset(t, s, "stream to a net no map lists yet")
	}

	m2 := threeSites(t, base, false, true)
	for _, g := range []*testGW{a, b} {
		res, err := g.Reload(m2)
		if err != nil {
			t.Fatalf("reload %s: %v", g.site.Name, err)
		}
		if fmt.Sprint(res.Removed) != "[c]" || len(res.Added)+len(res.Moved) != 0 {
			t.Errorf("reload %s: %s, want c removed only", g.site.Name, res)
		}
	}
	for i, f := range rest {
		if err := f(); err != nil {
			t.Errorf("stream %d a->b across the reload: %v", i, err)
		}
	}
	if err := toC(); err != nil {
		t.Errorf("stream a->c running when c was removed: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for linksTo(a, "c") > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := linksTo(a, "c"); n > 0 {
		t.Errorf("a still has %d links to the removed site c", n)
	}
	if s, err := lanOpen(a.LANAddr(), nodeA, sumC); err == nil {
		expectReset(t, s, "stream to a site the reload removed")
	}
	if err := gatedStream(t, a.LANAddr(), nodeA, sumB2, 1<<20, 11)(); err != nil {
		t.Errorf("stream to b's net added by the reload: %v", err)
	}

	// This site's listeners cannot move under a running gateway.
	mv := sitemap.NewBuilder()
	for _, s := range m2.Sites() {
		wan := s.WAN
		if s.Name == "a" {
			wan = netip.AddrPortFrom(gwA, freePort(t, gwA))
		}
		mv.AddSite(s.Name, s.ID, s.LAN, wan)
		mv.AddNet(s.Name, netip.PrefixFrom(s.LAN.Addr(), 16).Masked())
	}
	bad, err := mv.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reload(bad); err == nil || !strings.Contains(err.Error(), "restart the service") {
		t.Errorf("reload moving a's WAN listener: %v, want a refusal naming the restart", err)
	}
	if err := gatedStream(t, a.LANAddr(), nodeA, sumB, 1<<20, 12)(); err != nil {
		t.Errorf("stream after a refused reload: %v", err)
	}

	// c comes back: a dials it again (a's id is lower).
	for _, g := range []*testGW{a, b} {
		if res, err := g.Reload(m1); err != nil || fmt.Sprint(res.Added) != "[c]" {
			t.Fatalf("reload %s with c back: %s, %v", g.site.Name, res, err)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for !a.allUp() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := gatedStream(t, a.LANAddr(), nodeA, sumC, 1<<20, 13)(); err != nil {
		t.Errorf("stream to c after it came back: %v", err)
	}
	a.stop()
	<-a.done
	if _, err := a.Reload(m1); !errors.Is(err, errNotRunning) {
		t.Errorf("reload of a stopped gateway: %v", err)
	}
}

// TestReadyTag: /ready?tag= answers 409 for another job's tag, and as
// /ready for the gateway's own or none.
func TestReadyTag(t *testing.T) {
	m := testMap(t)
	maddr := netip.AddrPortFrom(gwA, freePort(t, gwA)).String()
	a := startGW(t, m, "a", func(c *Config) { c.MetricsAddr, c.ReadyTag = maddr, "job-1" })
	startGW(t, m, "b", nil)
	<-a.Ready()
	for _, tc := range []struct {
		query string
		code  int
	}{{"", http.StatusOK}, {"?tag=job-1", http.StatusOK}, {"?tag=job-2", http.StatusConflict}} {
		var r *http.Response
		var err error
		for i := 0; i < 100; i++ {
			if r, err = http.Get("http://" + maddr + "/ready" + tc.query); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != tc.code {
			t.Errorf("/ready%s: %d, want %d", tc.query, r.StatusCode, tc.code)
		}
	}
}

// TestDegradedMetric: what the gateway found missing at start is exported
// as mpi5k_degraded{what}, as this host's settings dictate (keep-warm
// checked here: the line appears exactly when the sysctl is not 0).
func TestDegradedMetric(t *testing.T) {
	m := testMap(t)
	maddr := netip.AddrPortFrom(gwA, freePort(t, gwA)).String()
	a := startGW(t, m, "a", func(c *Config) { c.MetricsAddr, c.KeepWarm, c.ExpressCC = maddr, true, "cubic" })
	startGW(t, m, "b", nil)
	<-a.Ready()
	warm, _, werr := tuning.WarmState()
	var body string
	for i := 0; i < 100; i++ {
		if r, err := http.Get("http://" + maddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			body = string(b)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := strings.Contains(body, `mpi5k_degraded{reason="`+degraded.NotWarm+`",site="a"} 1`)
	if want := werr == nil && !warm; got != want {
		t.Errorf("keep-warm degradation exported: %v, want %v (warm %v, err %v):\n%s", got, want, warm, werr, grepLines(body, "mpi5k_degraded"))
	}
	a.degrade("test_feature")
	if r, err := http.Get("http://" + maddr + "/metrics"); err == nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if !strings.Contains(string(b), `mpi5k_degraded{reason="test_feature",site="a"} 1`) {
			t.Errorf("a degradation added while running is not exported:\n%s", grepLines(string(b), "mpi5k_degraded"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestReadySites: /ready?sites= looks at the links to those sites only.
func TestReadySites(t *testing.T) {
	m := testMap(t)
	b := sitemap.NewBuilder()
	for _, s := range m.Sites() {
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
	}
	b.AddSite("c", 3, netip.AddrPortFrom(gwC, freePort(t, gwC)), netip.AddrPortFrom(gwC, freePort(t, gwC)))
	m3, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	maddr := netip.AddrPortFrom(gwA, freePort(t, gwA)).String()
	// Not primed: a gateway stopped while it primes a link panics in
	// relay (Link.fail returns a token to the nil stream of a PAD frame).
	startGW(t, m3, "a", func(c *Config) { c.MetricsAddr, c.Prime = maddr, false })
	startGW(t, m3, "b", func(c *Config) { c.Prime = false }) // c's gateway never runs
	get := func(q string) int {
		for i := 0; i < 200; i++ {
			if r, err := http.Get("http://" + maddr + "/ready" + q); err == nil {
				r.Body.Close()
				if r.StatusCode == http.StatusOK || q != "?sites=a,b" || i > 150 {
					return r.StatusCode
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		return 0
	}
	if code := get("?sites=a,b"); code != http.StatusOK {
		t.Errorf("/ready?sites=a,b with a and b up: %d", code)
	}
	for _, q := range []string{"", "?sites=a,c", "?sites=a,x"} {
		if code := get(q); code != http.StatusServiceUnavailable {
			t.Errorf("/ready%s with c down: %d, want 503", q, code)
		}
	}
}

// keyMap is testMap's two sites (listeners of base) with a's keys as, b's
// key kb.
func keyMap(t *testing.T, base *sitemap.Map, kb ed25519.PublicKey, as ...ed25519.PublicKey) *sitemap.Map {
	t.Helper()
	b := sitemap.NewBuilder()
	for _, s := range base.Sites() {
		b.AddSite(s.Name, s.ID, s.LAN, s.WAN)
		b.AddNet(s.Name, netip.PrefixFrom(s.LAN.Addr(), 16).Masked())
	}
	for _, k := range as {
		b.AddKey("a", k)
	}
	m, err := b.AddKey("b", kb).Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReloadKeys: a key rotated by reloads alone, while a stream runs.
// a's key file gets a new key; the maps first list both of a's keys, a
// reloads and proves the new one; then the old key leaves the maps: b
// breaks the links a made with it, a resumes them proving the new key,
// and the stream ends intact. A reload that would switch to a keyless
// map, or leave out this gateway's own key, is refused.
func TestReloadKeys(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "a.key")
	oldA, err := GenerateKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	newA, err := GenerateKey(filepath.Join(dir, "a-new.key"))
	if err != nil {
		t.Fatal(err)
	}
	kb := newKeys(t, "b")
	base := testMap(t)
	m1 := keyMap(t, base, kb.pub("b"), oldA)
	a := startGW(t, m1, "a", func(c *Config) { c.KeyFile = keyFile })
	b := startGW(t, m1, "b", withKey(kb))
	waitReady(t, a, b)
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	finish := gatedStream(t, a.LANAddr(), nodeA, dst, 8<<20, 9)

	// The new key beside the old one, everywhere: nothing to redo.
	m2 := keyMap(t, base, kb.pub("b"), oldA, newA)
	for _, g := range []*testGW{a, b} {
		if res, err := g.Reload(m2); err != nil || len(res.Reauthenticated) > 0 || res.NewKey {
			t.Fatalf("%s, both keys listed: %v, %v", g.site.Name, res, err)
		}
	}
	// a's key file now holds the new key.
	if err := os.Rename(filepath.Join(dir, "a-new.key"), keyFile); err != nil {
		t.Fatal(err)
	}
	if res, err := a.Reload(m2); err != nil || !res.NewKey {
		t.Fatalf("a after its key file changed: %v, %v (want its key changed)", res, err)
	}
	// The old key leaves the maps: b's links were made with it.
	m3 := keyMap(t, base, kb.pub("b"), newA)
	res, err := b.Reload(m3)
	if err != nil || len(res.Reauthenticated) != 1 || res.Reauthenticated[0] != "a" {
		t.Fatalf("b without a's old key: %v, %v (want a reauthenticated)", res, err)
	}
	if _, err := a.Reload(m3); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatalf("the stream across the rotation: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		proved, up := 0, 0
		for _, l := range b.allLinks() {
			if l.Down() {
				continue
			}
			up++
			if k, ok := l.Conn().(*relay.SealedConn).Peer.(ed25519.PublicKey); ok && k.Equal(newA) {
				proved++
			}
		}
		if up == b.mine.numLinks() && proved == up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b: %d links up, %d of them made with a's new key; want all %d", up, proved, b.mine.numLinks())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := counter(t, a, "mpi5k_wan_resumes_total") + counter(t, b, "mpi5k_wan_resumes_total"); n < 1 {
		t.Errorf("links resumed %v times, want at least once", n)
	}

	// Refused: a keyless map; a map without a's own key. The map in force
	// stays.
	if _, err := b.Reload(threeSites(t, base, false, false)); err == nil || !strings.Contains(err.Error(), "never turns authentication off") {
		t.Errorf("b to a keyless map: %v", err)
	}
	other := newKeys(t, "x").pub("x")
	if _, err := a.Reload(keyMap(t, base, kb.pub("b"), other)); err == nil || !strings.Contains(err.Error(), keyFile) {
		t.Errorf("a to a map without its key: %v", err)
	}
	if a.curMap() != m3 || b.curMap() != m3 {
		t.Error("a refused reload changed the map in force")
	}
}
