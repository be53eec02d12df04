package gateway

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/seal"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/tuning"
)

// gwProxy is an address outside both sites for a relay between the
// gateways (a man in the middle, or the path of a NAT).
var gwProxy = netip.MustParseAddr("127.3.0.1")

type siteKeys map[string]ed25519.PrivateKey

func newKeys(t testing.TB, sites ...string) siteKeys {
	ks := siteKeys{}
	for _, s := range sites {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		ks[s] = k
	}
	return ks
}

func (ks siteKeys) pub(s string) ed25519.PublicKey { return ks[s].Public().(ed25519.PublicKey) }

// keyedMap is testMap with the keys of ks; bWAN, if valid, replaces b's
// WAN address (a gateway a that dials through a relay).
func keyedMap(t testing.TB, lanA, wanA, lanB, wanB netip.AddrPort, ks siteKeys) *sitemap.Map {
	b := sitemap.NewBuilder().
		AddSite("a", 1, lanA, wanA).AddSite("b", 2, lanB, wanB).
		AddNet("a", netip.MustParsePrefix("127.1.0.0/16")).
		AddNet("b", netip.MustParsePrefix("127.2.0.0/16"))
	if ks != nil {
		b.AddKey("a", ks.pub("a")).AddKey("b", ks.pub("b"))
	}
	m, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ports(t testing.TB) (lanA, wanA, lanB, wanB netip.AddrPort) {
	return netip.AddrPortFrom(gwA, freePort(t, gwA)), netip.AddrPortFrom(gwA, freePort(t, gwA)),
		netip.AddrPortFrom(gwB, freePort(t, gwB)), netip.AddrPortFrom(gwB, freePort(t, gwB))
}

// withKey gives each gateway its site's key from ks.
func withKey(ks siteKeys) func(*Config) {
	return func(c *Config) { c.Key = ks[c.Site] }
}

func waitReady(t testing.TB, gs ...*testGW) {
	t.Helper()
	for _, g := range gs {
		select {
		case <-g.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("mesh did not come up")
		}
	}
}

// TestKeyedPair: with keys in the map the links run TLS, streams arrive
// intact, the socket under the TLS conn is still reached for TCP_INFO,
// and the dialer dials from its map WAN address.
func TestKeyedPair(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	a := startGW(t, m, "a", withKey(ks))
	b := startGW(t, m, "b", withKey(ks))
	waitReady(t, a, b)
	for _, l := range append(a.allLinks(), b.allLinks()...) {
		if _, ok := l.Conn().(*relay.SealedConn); !ok {
			t.Fatalf("link conn is %T, want a relay.SealedConn", l.Conn())
		}
		if _, err := tuning.TCPInfo(l.Conn()); err != nil {
			t.Fatalf("TCP_INFO through the sealed conn: %v", err)
		}
	}
	// The dialer binds its map address, whose own pool of pending slots
	// no stranger takes (admit.go); a site behind NAT, which cannot, is
	// accepted from any address (TestNATHigherSite).
	for _, l := range b.allLinks() {
		if src := l.Conn().RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); src != gwA {
			t.Fatalf("dialer's source is %v, not its map WAN address %v", src, gwA)
		}
	}
	dst := testnet.Serve(t, nodeB, testnet.SumServer)
	for i := range 8 {
		c, err := lanOpen(a.LANAddr(), nodeA, dst)
		if err != nil {
			t.Fatal(err)
		}
		if err := testnet.SendAndCheck(c, mrand.New(mrand.NewPCG(1, uint64(i))), 1<<(2*i+3)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// TestWrongKeyRefused: a gateway at the right address whose key the map
// does not list for its site (its own map lists it: it believes it is
// the site) is refused, whether it dials or accepts: no link comes up,
// the acceptor counts the refusals and an honest dialer its failed dials.
func TestWrongKeyRefused(t *testing.T) {
	for _, impostor := range []string{"a", "b"} { // a dials, b accepts
		t.Run("impostor_"+impostor, func(t *testing.T) {
			ks := newKeys(t, "a", "b")
			bad := siteKeys{"a": ks["a"], "b": ks["b"]}
			bad[impostor] = newKeys(t, impostor)[impostor]
			lanA, wanA, lanB, wanB := ports(t)
			honest := keyedMap(t, lanA, wanA, lanB, wanB, ks)
			forged := keyedMap(t, lanA, wanA, lanB, wanB, bad)
			mapOf := func(s string) *sitemap.Map {
				if s == impostor {
					return forged
				}
				return honest
			}
			a := startGW(t, mapOf("a"), "a", withKey(bad))
			b := startGW(t, mapOf("b"), "b", withKey(bad))
			// An impostor dialer shows b its key (wan_auth); against an
			// impostor acceptor the honest dialer ends the handshake
			// before it shows one (wan_tls).
			reason := map[string]string{"a": "wan_auth", "b": "wan_tls"}[impostor]
			deadline := time.Now().Add(10 * time.Second)
			for refusedFor(t, b, reason) < 2 || counter(t, a, "mpi5k_wan_dial_failures_total") < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("after 10 s: b counted %v %s refusals, a %v failed dials; want 2 each",
						refusedFor(t, b, reason), reason, counter(t, a, "mpi5k_wan_dial_failures_total"))
				}
				time.Sleep(50 * time.Millisecond)
			}
			if n := len(a.allLinks()) + len(b.allLinks()); n != 0 {
				t.Fatalf("%d links up with an impostor", n)
			}
		})
	}
}

// recConn records what is written through it.
type recConn struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *recConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// TestReplayedHandshake: the bytes an honest gateway a sent to open a
// link, replayed on a new connection, do not open one: TLS 1.3 without
// resumption binds the client's flight to the server's fresh key share,
// so the replayed Finished does not verify.
func TestReplayedHandshake(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	b := startGW(t, m, "b", withKey(ks))
	auth, err := newPeerAuth(m, mustSite(t, m, "a"), ks["a"], "test", seal.ModeEncrypt)
	if err != nil {
		t.Fatal(err)
	}
	site, _ := m.Site("b")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The original: a complete TLS handshake and relay HELLO as site a.
	raw, err := net.Dial("tcp", wanB.String())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recConn{Conn: raw}
	sc, _, err := auth.handshake(ctx, rec, auth.dialer(site), true)
	if err != nil {
		t.Fatalf("honest handshake: %v", err)
	}
	h := b.helloIn(b.mine, 0)
	h.SiteID, h.Name = 1, "a"
	if _, err := relay.Handshake(ctx, sc, h); err != nil {
		t.Fatalf("honest HELLO: %v", err)
	}
	raw.Close()
	if n := refusedFor(t, b, "wan_auth") + refusedFor(t, b, "wan_tls"); n != 0 {
		t.Fatalf("honest handshake refused (%v)", n)
	}

	// The replay: the same bytes on a new connection.
	rc, err := net.Dial("tcp", wanB.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rec.mu.Lock()
	replay := bytes.Clone(rec.out.Bytes())
	rec.mu.Unlock()
	if _, err := rc.Write(replay); err != nil {
		t.Fatal(err)
	}
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, rc) // the server's flight, then the end
	deadline := time.Now().Add(5 * time.Second)
	for refusedFor(t, b, "wan_tls") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("replayed handshake not refused (wan_tls)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	for _, l := range b.allLinks() {
		if l.Conn().RemoteAddr().String() == rc.LocalAddr().String() {
			t.Fatal("the replayed handshake opened a link")
		}
	}
}

func mustSite(t testing.TB, m *sitemap.Map, name string) *sitemap.Site {
	s, ok := m.Site(name)
	if !ok {
		t.Fatalf("no site %s", name)
	}
	return s
}

// flipProxy relays TCP from its listener to dst and flips one bit of the
// first direction (client to dst) once armed and past at bytes. from is
// its source address toward dst.
type flipProxy struct {
	ln      net.Listener
	armed   atomic.Bool
	at      int64
	seen    atomic.Int64
	flipped atomic.Bool
}

func startFlipProxy(t *testing.T, dst netip.AddrPort, from netip.Addr, at int64) (*flipProxy, netip.AddrPort) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(gwProxy, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	p := &flipProxy{ln: ln, at: at}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
			u, err := d.Dial("tcp", dst.String())
			if err != nil {
				c.Close()
				continue
			}
			// A reset on one side resets the other: an orderly close
			// there would read as the peer gateway ending the link (and
			// could drop the alert still unread on this side).
			go func() { _, err := io.Copy(c, u); closeLike(c, err) }()
			go func() { closeLike(u, p.pump(u, c)) }()
		}
	}()
	return p, ln.Addr().(*net.TCPAddr).AddrPort()
}

// closeLike closes c after its copy ended with err: with a reset unless
// the copy ended at the source's end of file.
func closeLike(c net.Conn, err error) {
	if err != nil {
		c.(*net.TCPConn).SetLinger(0)
	}
	c.Close()
}

func (p *flipProxy) pump(dst, src net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.armed.Load() && !p.flipped.Load() {
			if seen := p.seen.Add(int64(n)); seen > p.at && p.flipped.CompareAndSwap(false, true) {
				buf[n/2] ^= 0x10
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// TestBitFlip: a man in the middle flips one bit of the stream between
// the gateways. With keys, encrypted or integrity-only records, the
// receiving gateway's record layer refuses the record, the link goes
// down and the destination never reads a wrong byte (it compares every
// byte with the sender's generator). Without keys the same flip reaches
// the destination: the control that shows the test can fail.
func TestBitFlip(t *testing.T) {
	for _, name := range []string{"keyed", "keyed-integrity-only", "keyless"} {
		keyed := name != "keyless"
		t.Run(name, func(t *testing.T) {
			var ks siteKeys
			if keyed {
				ks = newKeys(t, "a", "b")
			}
			lanA, wanA, lanB, wanB := ports(t)
			mb := keyedMap(t, lanA, wanA, lanB, wanB, ks)
			// Keyless, b checks the source address: the proxy sends from a's.
			proxy, via := startFlipProxy(t, wanB, gwA, 1<<20)
			ma := keyedMap(t, lanA, wanA, lanB, via, ks)
			// One link, no filler: the flip lands in the stream's bytes.
			tweak := func(c *Config) {
				withKey(ks)(c)
				c.Express, c.Prime = false, false
				c.WANIntegrityOnly = name == "keyed-integrity-only"
			}
			a := startGW(t, ma, "a", tweak)
			b := startGW(t, mb, "b", tweak)
			waitReady(t, a, b)
			before := b.allLinks()

			const size = 16 << 20
			var wrong, got atomic.Int64
			wrong.Store(-1)
			dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
				defer c.Close()
				r := mrand.New(mrand.NewPCG(7, 7))
				want := make([]byte, 64<<10)
				buf := make([]byte, 64<<10)
				var off int64
				for {
					n, err := io.ReadFull(c, buf)
					if n > 0 {
						testnet.Fill(r, want[:len(buf)])
						if i := firstDiff(buf[:n], want[:n]); i >= 0 && wrong.Load() < 0 {
							wrong.Store(off + int64(i))
						}
						off += int64(n)
						got.Store(off)
					}
					if err != nil {
						return
					}
				}
			})
			c, err := lanOpen(a.LANAddr(), nodeA, dst)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			proxy.armed.Store(true)
			r := mrand.New(mrand.NewPCG(7, 7))
			buf := make([]byte, 64<<10)
			var werr error
			for sent := 0; sent < size && werr == nil; sent += len(buf) {
				testnet.Fill(r, buf)
				_, werr = c.Write(buf)
			}
			c.CloseWrite()
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			io.Copy(io.Discard, c)
			time.Sleep(200 * time.Millisecond) // the destination's last reads
			if !proxy.flipped.Load() {
				t.Fatal("the proxy flipped no bit")
			}
			if keyed {
				// TLS finds the flipped record, the connection is torn
				// down, and the link resumes on a new one (the proxy
				// flips once): the stream completes intact.
				if w := wrong.Load(); w >= 0 {
					t.Fatalf("a corrupted byte reached the destination at offset %d", w)
				}
				if got.Load() != size {
					t.Fatalf("the destination got %d of %d bytes", got.Load(), size)
				}
				var resumes uint64
				for _, l := range before {
					resumes += l.ResumeStats().Resumes
				}
				if resumes == 0 {
					t.Fatal("no link was torn down and resumed after the corrupted record")
				}
				return
			}
			if wrong.Load() < 0 {
				t.Fatalf("keyless: the flipped bit was not delivered (got %d bytes): the test cannot tell", got.Load())
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestKeyConfig: the mistakes an operator can make with keys are refused
// at start, each with its fix.
func TestKeyConfig(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	keyed := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	keyless := keyedMap(t, lanA, wanA, lanB, wanB, nil)
	other := newKeys(t, "a")
	for _, c := range []struct {
		name string
		m    *sitemap.Map
		key  ed25519.PrivateKey
		file string
		want string
	}{
		{"key with a keyless map", keyless, ks["a"], "", "the site map lists no keys"},
		{"keyed map without a key", keyed, nil, "", "give --key FILE"},
		{"key not in the map", keyed, other["a"], "", "is not listed for site a in the site map: add \"key a ed25519:"},
		{"missing key file", keyed, nil, "/nonexistent/gw.key", "mpi5k-gateway --gen-key /nonexistent/gw.key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := testConfig(c.m, "a")
			if err != nil {
				t.Fatal(err)
			}
			cfg.Key, cfg.KeyFile = c.key, c.file
			cfg.Logger = discardLog()
			g, err := New(cfg)
			if err == nil {
				g.lanLn.Close()
				g.wanLn.Close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// TestKeyFile: GenerateKey writes a 0600 key LoadKey reads back, never
// overwrites, and LoadKey refuses a key others may read, naming the fix.
func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.key")
	pub, err := GenerateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode(), err)
	}
	k, err := LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(k.Public()) {
		t.Fatal("loaded key differs from the generated one")
	}
	if _, err := GenerateKey(path); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("GenerateKey over an existing file: %v", err)
	}
	os.Chmod(path, 0o640)
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Fatalf("group-readable key: err = %v", err)
	}
}

// FuzzParseKeyFile: ParseKey never panics and accepts only Ed25519 keys.
func FuzzParseKeyFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "k")
	if _, err := GenerateKey(path); err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	f.Add(good)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKey(data, "fuzz")
		if err == nil && len(k) != ed25519.PrivateKeySize {
			t.Fatalf("accepted a key of %d bytes", len(k))
		}
		if err != nil && !strings.Contains(err.Error(), "--key fuzz") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestKeyRotation: while a site lists two keys, its gateway links with
// either, so it can move to the new key while its peers keep running.
func TestKeyRotation(t *testing.T) {
	ks := newKeys(t, "a", "b")
	next := newKeys(t, "a")["a"]
	lanA, wanA, lanB, wanB := ports(t)
	m, err := sitemap.NewBuilder().
		AddSite("a", 1, lanA, wanA).AddSite("b", 2, lanB, wanB).
		AddNet("a", netip.MustParsePrefix("127.1.0.0/16")).AddNet("b", netip.MustParsePrefix("127.2.0.0/16")).
		AddKey("a", ks.pub("a")).AddKey("a", next.Public().(ed25519.PublicKey)).AddKey("b", ks.pub("b")).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	b := startGW(t, m, "b", withKey(ks))
	for i, k := range []ed25519.PrivateKey{ks["a"], next} {
		a := startGW(t, m, "a", func(c *Config) { c.Key = k })
		waitReady(t, a, b)
		for _, l := range b.allLinks() {
			if l.Peer().Name != "a" {
				t.Fatalf("key %d: link to %q", i, l.Peer().Name)
			}
		}
		a.stop()
		<-a.done
	}
}

// FuzzAcceptorHandshake: whatever bytes a client sends first, the
// acceptor's TLS configuration never completes a handshake with them (a
// client must prove a listed key, which takes its private key and the
// server's fresh key share) and never panics. Seeds: an honest
// ClientHello, and a truncated record.
func FuzzAcceptorHandshake(f *testing.F) {
	ks := newKeys(f, "a", "b")
	lanA, wanA, lanB, wanB := ports(f)
	m := keyedMap(f, lanA, wanA, lanB, wanB, ks)
	acc, err := newPeerAuth(m, mustSite(f, m, "b"), ks["b"], "test", seal.ModeEncrypt)
	if err != nil {
		f.Fatal(err)
	}
	dial, err := newPeerAuth(m, mustSite(f, m, "a"), ks["a"], "test", seal.ModeEncrypt)
	if err != nil {
		f.Fatal(err)
	}
	cfg := acc.acceptor(func(*sitemap.Site) bool { return true })
	// The honest client's first flight, caught on a pipe.
	c, s := net.Pipe()
	go tls.Client(c, dial.dialer(mustSite(f, m, "b"))).Handshake()
	hello := make([]byte, 4096)
	n, _ := s.Read(hello)
	c.Close()
	s.Close()
	f.Add(hello[:n])
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, s := net.Pipe()
		go io.Copy(io.Discard, c) // the server's answers and alerts
		go func() {
			c.Write(data)
			c.Close() // then the end
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := tls.Server(s, cfg).HandshakeContext(ctx)
		s.Close()
		if err == nil {
			t.Fatalf("the acceptor completed a handshake with %d fuzzed bytes", len(data))
		}
	})
}

// TestWANEncryptMismatch: gateways whose --wan-encrypt differ never link.
// Each end of the handshake refuses with an error naming the flag, and
// a running acceptor counts the refusal as wan_encrypt.
func TestWANEncryptMismatch(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	for _, dialerMode := range []seal.Mode{seal.ModeEncrypt, seal.ModeIntegrity} {
		acc, err := newPeerAuth(m, mustSite(t, m, "b"), ks["b"], "test", 1-dialerMode)
		if err != nil {
			t.Fatal(err)
		}
		dial, err := newPeerAuth(m, mustSite(t, m, "a"), ks["a"], "test", dialerMode)
		if err != nil {
			t.Fatal(err)
		}
		c, s := tcpPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs := make(chan error, 1)
		go func() {
			_, _, err := acc.handshake(ctx, s, acc.acceptor(func(*sitemap.Site) bool { return true }), false)
			s.Close()
			errs <- err
		}()
		_, _, derr := dial.handshake(ctx, c, dial.dialer(mustSite(t, m, "b")), true)
		c.Close()
		aerr := <-errs
		cancel()
		for side, err := range map[string]error{"dialer": derr, "acceptor": aerr} {
			if err == nil || !strings.Contains(err.Error(), "--wan-encrypt") {
				t.Errorf("dialer %v: the %s's error does not name --wan-encrypt: %v", dialerMode, side, err)
			}
		}
	}

	a := startGW(t, m, "a", func(c *Config) { withKey(ks)(c); c.WANIntegrityOnly = true })
	b := startGW(t, m, "b", withKey(ks))
	deadline := time.Now().Add(10 * time.Second)
	for refusedFor(t, b, "wan_encrypt") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: b counted %v wan_encrypt refusals, want 2", refusedFor(t, b, "wan_encrypt"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(a.allLinks()) + len(b.allLinks()); n != 0 {
		t.Fatalf("%d links up between gateways whose --wan-encrypt differ", n)
	}
}

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// TestSealedSmallMessageAllocs: with keys, the small-message path
// allocates no more than without (TestSmallMessageAllocs): records are
// sealed and opened in buffers the link keeps.
func TestSealedSmallMessageAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short, or the race detector (its instrumentation allocates)")
	}
	for _, integrity := range []bool{false, true} {
		ks := newKeys(t, "a", "b")
		lanA, wanA, lanB, wanB := ports(t)
		m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
		tweak := func(c *Config) { withKey(ks)(c); c.WANIntegrityOnly = integrity }
		a := startGW(t, m, "a", tweak)
		b := startGW(t, m, "b", tweak)
		waitReady(t, a, b)
		app, err := lanOpen(a.LANAddr(), nodeA, testnet.Echo(t, nodeB))
		if err != nil {
			t.Fatal(err)
		}
		per := testnet.RoundTripAllocs(t, app, 2000)
		app.Close()
		t.Logf("integrity-only %v: %.3f allocations per round trip", integrity, per)
		if per > 0.5 {
			t.Errorf("integrity-only %v: %.2f allocations per round trip; the small-message path should make none", integrity, per)
		}
	}
}
