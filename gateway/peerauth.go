package gateway

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
)

// WAN peer authentication (docs/security.md): when the site map lists
// gateway keys, every WAN connection runs TLS 1.3 before the relay HELLO,
// both ends present a certificate made from their site's Ed25519 key, and
// each accepts the other only if that key is one the map lists for the
// site it expects. No CA is involved: the map pins the keys.

// alpn names the protocol inside TLS: a TLS endpoint of another kind
// fails the handshake instead of reading relay frames.
const alpn = "mpi5k/1"

// GenerateKey writes a new Ed25519 private key to path (PEM, PKCS #8,
// mode 0600; an existing file is never overwritten) and returns its
// public key.
func GenerateKey(path string) (ed25519.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("key file %s exists: a gateway key is never overwritten; remove it first or give another path", path)
		}
		return nil, fmt.Errorf("key file: %w", err)
	}
	werr := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return nil, fmt.Errorf("key file %s: %w", path, werr)
	}
	return pub, nil
}

// LoadKey reads the Ed25519 private key GenerateKey wrote. A key file
// that the group or others may read is refused: whoever reads it is the
// site.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--key: %w (create one with mpi5k-gateway --gen-key %s)", err, path)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--key %s: the private key is readable by group or others (mode %04o): run chmod 600 %s",
			path, st.Mode().Perm(), path)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(&limitedReader{f, 64 << 10}); err != nil {
		return nil, fmt.Errorf("--key %s: %w", path, err)
	}
	return ParseKey(buf.Bytes(), path)
}

// limitedReader fails past n bytes: a key file is far smaller.
type limitedReader struct {
	f *os.File
	n int
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("larger than 64 KiB: not a key file")
	}
	p = p[:min(len(p), r.n)]
	n, err := r.f.Read(p)
	r.n -= n
	return n, err
}

// ParseKey parses the PEM text of a key file; path names it in errors.
func ParseKey(text []byte, path string) (ed25519.PrivateKey, error) {
	b, _ := pem.Decode(text)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("--key %s: no PEM \"PRIVATE KEY\" block: not a key mpi5k-gateway --gen-key wrote", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("--key %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("--key %s: a %T, want an Ed25519 key (mpi5k-gateway --gen-key)", path, k)
	}
	return ek, nil
}

// peerAuth holds this gateway's certificate and builds the TLS
// configurations of its WAN connections. A reload swaps in a new map and
// certificate (keys.go); every handshake reads the pair in force.
type peerAuth struct {
	cur atomic.Pointer[authState]
}

// authState is the site map whose keys are trusted and the certificate
// TLS presents.
type authState struct {
	m    *sitemap.Map
	cert tls.Certificate
}

func (a *peerAuth) state() *authState { return a.cur.Load() }

// newPeerAuth checks that key is one the map lists for site and makes the
// certificate TLS presents.
func newPeerAuth(m *sitemap.Map, site *sitemap.Site, key ed25519.PrivateKey, keyPath string) (*peerAuth, error) {
	st, err := newAuthState(m, site, key, keyPath)
	if err != nil {
		return nil, err
	}
	a := &peerAuth{}
	a.cur.Store(st)
	return a, nil
}

func newAuthState(m *sitemap.Map, site *sitemap.Site, key ed25519.PrivateKey, keyPath string) (*authState, error) {
	pub := key.Public().(ed25519.PublicKey)
	if s, ok := m.SiteByKey(pub); !ok || s != site {
		return nil, fmt.Errorf("--key %s: its public key %s is not listed for site %s in the site map: add \"key %s %s\" to the map of every gateway",
			keyPath, sitemap.FormatKey(pub), site.Name, site.Name, sitemap.FormatKey(pub))
	}
	// The certificate only carries the key: validity, names and the
	// self-signature are never checked (the map pins the key), so they
	// are fixed values.
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "mpi5k gateway " + site.Name},
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("gateway: certificate from --key %s: %w", keyPath, err)
	}
	return &authState{m: m, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}, nil
}

// base is what both ends share: TLS 1.3 only (no renegotiation, no
// static-RSA or CBC suites, forward secrecy), no resumption (so no
// 0-RTT data and no ticket to replay), full-size records from the start.
func (a *peerAuth) base() *tls.Config {
	// The certificate in force when the handshake runs, not when the
	// configuration was made: the acceptor's lives as long as the gateway.
	cert := func() *tls.Certificate { return &a.state().cert }
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert(), nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert(), nil
		},
		SessionTicketsDisabled:      true,
		NextProtos:                  []string{alpn},
		DynamicRecordSizingDisabled: true,
	}
}

// peerKey is the Ed25519 key of the peer's leaf certificate. TLS has
// already checked that the peer holds its private key (CertificateVerify).
func peerKey(raw [][]byte) (ed25519.PublicKey, error) {
	if len(raw) == 0 {
		return nil, errors.New("peer sent no certificate")
	}
	c, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, fmt.Errorf("peer certificate: %w", err)
	}
	k, ok := c.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("peer certificate has a %T key, want Ed25519", c.PublicKey)
	}
	return k, nil
}

// dialer is the client configuration toward site s: its key must be one
// the map lists for s.
func (a *peerAuth) dialer(s *sitemap.Site) *tls.Config {
	c := a.base()
	c.ServerName = "mpi5k" // sent in the clear; the peer's name is not checked
	// The chain is not verified against a CA: VerifyPeerCertificate pins
	// the key instead.
	c.InsecureSkipVerify = true
	c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		k, err := peerKey(raw)
		if err != nil {
			return err
		}
		if o, ok := a.state().m.SiteByKey(k); !ok || o.ID != s.ID {
			return fmt.Errorf("peer at %v proved key %s, which the site map does not list for site %s", s.WAN, sitemap.FormatKey(k), s.Name)
		}
		return nil
	}
	return c
}

// acceptor is the server configuration: the client must prove a key the
// map lists for a site that dials us (accept says which).
func (a *peerAuth) acceptor(accept func(*sitemap.Site) bool) *tls.Config {
	c := a.base()
	c.ClientAuth = tls.RequireAnyClientCert
	c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		k, err := peerKey(raw)
		if err != nil {
			return err
		}
		s, ok := a.state().m.SiteByKey(k)
		if !ok {
			return fmt.Errorf("peer proved key %s, which is in no site of the site map", sitemap.FormatKey(k))
		}
		if !accept(s) {
			return fmt.Errorf("peer proved the key of site %s, which does not dial this gateway (this gateway dials it: a site behind NAT dials, else the lower site id)", s.Name)
		}
		return nil
	}
	return c
}

// handshake runs TLS over c and returns the link's conn and the site whose
// key the peer proved.
func (a *peerAuth) handshake(ctx context.Context, c *net.TCPConn, cfg *tls.Config, client bool) (*wanConn, *sitemap.Site, error) {
	bc := &batchConn{TCPConn: c}
	var tc *tls.Conn
	if client {
		tc = tls.Client(bc, cfg)
	} else {
		tc = tls.Server(bc, cfg)
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), err)
	}
	st := tc.ConnectionState()
	k, err := peerKey(certsDER(st.PeerCertificates))
	if err != nil {
		return nil, nil, err
	}
	// VerifyPeerCertificate found it, unless a reload changed the map since.
	s, ok := a.state().m.SiteByKey(k)
	if !ok {
		tc.Close()
		return nil, nil, fmt.Errorf("peer at %v proved key %s, which the site map no longer lists", c.RemoteAddr(), sitemap.FormatKey(k))
	}
	return &wanConn{Conn: tc, tcp: c, bc: bc}, s, nil
}

func certsDER(cs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(cs))
	for i, c := range cs {
		out[i] = c.Raw
	}
	return out
}

// wanConn is a WAN link's encrypted conn. NetConn gives relay.TCPOf the
// socket, for TCP_INFO and socket options; having no SyscallConn of its
// own, the link reads it with plain Read, not on the relay's poller
// thread, which would read ciphertext.
type wanConn struct {
	*tls.Conn
	tcp  *net.TCPConn
	bc   *batchConn
	wmu  sync.Mutex
	link atomic.Pointer[relay.Link]
}

// tlsNoPoller: a TLS link runs without the relay's poller thread, and so
// do the streams homed on it. The thread cannot read a TLS link (it reads
// the raw socket), and a stream it served would hand every frame to the
// link's writer goroutine, a thread wake-up more per message, instead of
// writing it inline as a stream pump on Go's poller does
// (bench/figures/security).
const tlsNoPoller = true

// NetConn is the TCP connection under TLS.
func (c *wanConn) NetConn() net.Conn { return c.tcp }

// Write encrypts p and sends its records with one write(2): crypto/tls
// writes each record (at most 16 KiB) with a call of its own, nine system
// calls for one 128 KiB chunk.
func (c *wanConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.bc.begin()
	n, err := c.Conn.Write(p)
	if ferr := c.bc.flush(); err == nil {
		err = ferr
	}
	return n, err
}

// batchConn is the socket under TLS: between begin and flush it collects
// what TLS writes; otherwise (the handshake, an alert sent while reading)
// it writes through.
type batchConn struct {
	*net.TCPConn
	mu       sync.Mutex
	batching bool
	buf      []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.batching {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.TCPConn.Write(p)
}

func (b *batchConn) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.TCPConn.Write(b.buf)
	if cap(b.buf) > 1<<20 {
		b.buf = nil // a one-off large write does not pin its buffer
	} else {
		b.buf = b.buf[:0]
	}
	return err
}

// Close closes the socket without TLS's close_notify, which could wait up
// to 5 s for a peer that does not read: the relay ends links with its own
// frames (RETIRE, the drain) and treats a cut mid-frame as a failure. A
// link that failed is reset (SO_LINGER 0), as the relay does to a bare
// TCP link, so the peer learns at once; a retired one closes gracefully,
// since its RETIRE may still be in the socket.
func (c *wanConn) Close() error {
	if l := c.link.Load(); l == nil || !errors.Is(l.Err(), relay.ErrLinkRetired) {
		c.tcp.SetLinger(0)
	}
	return c.tcp.Close()
}

// initAuth loads the gateway's key when the map lists keys, and refuses a
// configuration that mixes the two modes.
func (g *Gateway) initAuth() error {
	key := g.cfg.Key
	if !g.cfg.Map.HasKeys() {
		if key != nil || g.cfg.KeyFile != "" {
			return fmt.Errorf("gateway: a key is given (--key) but the site map lists no keys: add a \"key SITE ed25519:...\" record for every site (docs/security.md), or leave out --key")
		}
		g.log.Warn("the WAN is unauthenticated and unencrypted: the site map lists no gateway keys, so peers are accepted by source address and anyone on the path reads and can alter every stream (docs/security.md)")
		return nil
	}
	if key == nil {
		if g.cfg.KeyFile == "" {
			return fmt.Errorf("gateway: the site map lists gateway keys, so this gateway needs its private key: give --key FILE (create one with mpi5k-gateway --gen-key FILE and list the key it prints for site %s)", g.site.Name)
		}
		var err error
		if key, err = LoadKey(g.cfg.KeyFile); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	path := g.cfg.KeyFile
	if path == "" {
		path = "(Config.Key)"
	}
	a, err := newPeerAuth(g.cfg.Map, g.site, key, path)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.auth = a
	g.acceptTLS = a.acceptor(func(s *sitemap.Site) bool {
		p := g.peer(s.ID)
		return p != nil && !p.dialer
	})
	return nil
}

// secureDial runs TLS over a dialed WAN connection (keyed maps); the
// peer must prove a key of p's site. Keyless maps use c as it is.
func (g *Gateway) secureDial(ctx context.Context, c *net.TCPConn, p *peer) (net.Conn, error) {
	if g.auth == nil {
		return c, nil
	}
	wc, _, err := g.auth.handshake(ctx, c, g.auth.dialer(p.site), true)
	if err != nil {
		return nil, err
	}
	return wc, nil
}

// admitWAN decides which peers an accepted WAN connection may be: with
// keys, the site whose key it proves in TLS, from any address (NAT);
// without, the sites whose WAN address is its source. reason labels a
// refusal.
func (g *Gateway) admitWAN(ctx context.Context, c *net.TCPConn, remote netip.AddrPort) (net.Conn, []*peer, string, error) {
	if g.auth != nil {
		wc, s, err := g.auth.handshake(ctx, c, g.acceptTLS, false)
		if err != nil {
			return nil, nil, "wan_auth", err
		}
		p := g.peer(s.ID)
		if p == nil { // taken out of the map by a reload meanwhile
			wc.Close()
			return nil, nil, "wan_auth", fmt.Errorf("site %s is no longer in the site map", s.Name)
		}
		return wc, []*peer{p}, "", nil
	}
	var cands []*peer
	for _, p := range g.peerList() {
		if !p.dialer && p.site.WAN.Addr() == remote.Addr() {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil, nil, "wan_source", errors.New("source is no peer gateway in the site map")
	}
	return c, cands, "", nil
}
