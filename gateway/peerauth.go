package gateway

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/mpi5k/mpi5k/gateway/keyfile"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/seal"
	"github.com/mpi5k/mpi5k/sitemap"
)

// WAN peer authentication (docs/security.md): when the site map lists
// gateway keys, every WAN connection runs TLS 1.3 before the relay HELLO,
// both ends present a certificate made from their site's Ed25519 key, and
// each accepts the other only if that key is one the map lists for the
// site it expects. No CA is involved: the map pins the keys. TLS ends
// with its handshake: the link runs on package seal's records, keyed from
// it (docs/wire-format.md, "Records").

// protos name the protocol inside TLS, one per record format and mode
// (ALPN): a TLS endpoint of another kind fails the handshake instead of
// reading relay records, and the two gateways learn each other's
// --wan-encrypt there. mpi5k/3 records update their keys (package seal);
// mpi5k/2 is what gateways built before that speak, so a pair where one
// is such a build (a site's service gateway) still peers, with keys that
// never change.
var protos = [2][2]string{
	seal.ModeEncrypt:   {"mpi5k/2", "mpi5k/3"},
	seal.ModeIntegrity: {"mpi5k/2+integrity-only", "mpi5k/3+integrity-only"},
}

// modeOf is the record mode an ALPN protocol names, and whether its keys
// update.
func modeOf(proto string) (m seal.Mode, updating, ok bool) {
	for m, ps := range protos {
		for v, p := range ps {
			if p == proto {
				return seal.Mode(m), v == 1, true
			}
		}
	}
	return 0, false, false
}

// encryptFlag renders mode as the --wan-encrypt setting that selects it.
func encryptFlag(m seal.Mode) string {
	if m == seal.ModeIntegrity {
		return "--wan-encrypt=false"
	}
	return "--wan-encrypt=true"
}

// errWANEncrypt: the two gateways' --wan-encrypt differ.
var errWANEncrypt = errors.New("--wan-encrypt differs between the gateways")

// errModeMismatch names the flag two gateways disagree on.
func errModeMismatch(peer, ours seal.Mode) error {
	return fmt.Errorf("%w: the peer gateway runs with %s (%s WAN records), this one with %s: set the same --wan-encrypt on every gateway",
		errWANEncrypt, encryptFlag(peer), peer, encryptFlag(ours))
}

// GenerateKey writes a new Ed25519 private key to path (PEM, PKCS #8,
// mode 0600; an existing file is never overwritten) and returns its
// public key.
func GenerateKey(path string) (ed25519.PublicKey, error) {
	pub, text, err := keyfile.New()
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
	_, werr := f.Write(text)
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

// ParseKey parses the text of a key file (package keyfile); path names
// it in errors.
func ParseKey(text []byte, path string) (ed25519.PrivateKey, error) {
	k, err := keyfile.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("--key %s: %w", path, err)
	}
	return k, nil
}

// peerAuth holds this gateway's certificate and builds the TLS
// configurations of its WAN connections. A reload swaps in a new map and
// certificate (keys.go); every handshake reads the pair in force.
type peerAuth struct {
	cur  atomic.Pointer[authState]
	mode seal.Mode // what the records after the handshake protect
	// limits bound each key of mpi5k/3 records (Config.KeyUpdate).
	limits seal.Limits
	// fixedKeys offers and knows mpi5k/2 alone, as a gateway built
	// before key updates does (tests of mixed builds).
	fixedKeys bool
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
func newPeerAuth(m *sitemap.Map, site *sitemap.Site, key ed25519.PrivateKey, keyPath string, mode seal.Mode) (*peerAuth, error) {
	st, err := newAuthState(m, site, key, keyPath)
	if err != nil {
		return nil, err
	}
	a := &peerAuth{mode: mode}
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
	// are fixed values. Whoever sends a ClientHello reads it, so it names
	// no site.
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "gateway"},
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
// 0-RTT data, no ticket to replay, and no NewSessionTicket after the
// handshake, which the switch to records relies on). Both modes are
// offered, this gateway's first, each in both formats (nextProtos): the
// server picks its own mode, in mpi5k/3 unless the client lacks it, and
// whichever end finds the other's mode differs refuses the connection
// with a message naming the flag, instead of a record that fails its tag.
// ALPN is part of the handshake TLS authenticates: nobody on the path can
// strip mpi5k/3 to keep a link on keys that never change.
func (a *peerAuth) base(client bool) *tls.Config {
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
		SessionTicketsDisabled: true,
		NextProtos:             a.nextProtos(client),
	}
}

// nextProtos is the ALPN list: this gateway's mode first, each mode in
// both formats. TLS servers pick by their own order, so the server lists
// mpi5k/3 first and picks it whenever the client offers it; the client
// lists mpi5k/2 first, which changes no choice and lets a server built
// before mpi5k/3 still read the client's mode and name a --wan-encrypt
// mismatch.
func (a *peerAuth) nextProtos(client bool) []string {
	own, other := protos[a.mode], protos[1-a.mode]
	switch {
	case a.fixedKeys:
		return []string{own[0], other[0]}
	case client:
		return []string{own[0], own[1], other[0], other[1]}
	}
	return []string{own[1], own[0], other[1], other[0]}
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
// the map lists for s, and its mode (the protocol it picked) ours.
func (a *peerAuth) dialer(s *sitemap.Site) *tls.Config {
	c := a.base(true)
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
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if m, _, ok := modeOf(cs.NegotiatedProtocol); ok && m != a.mode {
			return errModeMismatch(m, a.mode)
		}
		return nil
	}
	return c
}

// acceptor is the server configuration: the client must prove a key the
// map lists for a site that dials us (accept says which).
func (a *peerAuth) acceptor(accept func(*sitemap.Site) bool) *tls.Config {
	c := a.base(false)
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

// handshake runs TLS over c, derives the link's record keys from it and
// returns c as the link's SealedConn, with the site whose key the peer
// proved. TLS only authenticates and agrees on a secret: its own records
// end with the handshake.
//
// The acceptor answers a ClientHello that offers none of our protocols
// (not a gateway) with a reset and not a byte of its own, and tells its
// refusals apart: a key the map does not list is errUnknownKey whatever
// protocol the peer offered; errWANEncrypt only when the peer offered the
// other record mode (a gateway with the other --wan-encrypt ends its
// handshake there, before it shows its key).
func (a *peerAuth) handshake(ctx context.Context, c net.Conn, cfg *tls.Config, client bool) (*relay.SealedConn, *sitemap.Site, error) {
	tr := &tlsRecords{Conn: c}
	var tc *tls.Conn
	offered := ""        // the client's first protocol: its mode
	var keyErr error     // the acceptor's verdict on the client's key
	var notGateway error // the acceptor's verdict on the ClientHello
	if client {
		tc = tls.Client(tr, cfg)
	} else {
		tr.mute = true // until a ClientHello offers an mpi5k protocol
		cfg = cfg.Clone()
		cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			ours := false
			for _, p := range h.SupportedProtos {
				if _, _, ok := modeOf(p); ok {
					ours = true
				}
			}
			if !ours {
				// Reset before the server's flight (tr stays mute): a
				// stranger learns neither our certificate nor that TLS
				// runs here.
				notGateway = fmt.Errorf("ClientHello offers protocols %q, none of mpi5k's: not a gateway", h.SupportedProtos)
				return nil, notGateway
			}
			tr.mute = false
			offered = h.SupportedProtos[0]
			return nil, nil
		}
		verify := cfg.VerifyPeerCertificate
		cfg.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
			keyErr = verify(raw, chains)
			if keyErr != nil {
				keyErr = fmt.Errorf("%w: %w", errUnknownKey, keyErr)
			}
			return keyErr
		}
		tc = tls.Server(tr, cfg)
	}
	err := tc.HandshakeContext(ctx)
	peerMode, updating, known := modeOf(offered)
	if a.fixedKeys && updating {
		known = false // an older build knows no mpi5k/3
	}
	switch {
	case notGateway != nil:
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), notGateway)
	case keyErr != nil:
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), keyErr)
	case !client && known && peerMode != a.mode:
		// The dialer refuses our mode when it sees it; say why here too.
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), errModeMismatch(peerMode, a.mode))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), err)
	}
	st := tc.ConnectionState()
	m, updating, ok := modeOf(st.NegotiatedProtocol)
	if !ok || m != a.mode {
		return nil, nil, fmt.Errorf("TLS handshake with %v: protocol %q, want %q", c.RemoteAddr(), st.NegotiatedProtocol, protos[a.mode][1])
	}
	if tr.hn != 0 || tr.left != 0 {
		// TLS stopped inside a record: the bytes that follow would not be
		// the peer's first relay record.
		return nil, nil, fmt.Errorf("TLS handshake with %v: ended inside a TLS record", c.RemoteAddr())
	}
	k, err := peerKey(certsDER(st.PeerCertificates))
	if err != nil {
		return nil, nil, err
	}
	// VerifyPeerCertificate found it, unless a reload changed the map since.
	s, ok := a.state().m.SiteByKey(k)
	if !ok {
		tc.Close()
		return nil, nil, fmt.Errorf("peer at %v proved key %s, which the site map no longer lists: %w", c.RemoteAddr(), sitemap.FormatKey(k), errUnknownKey)
	}
	sealer, opener, err := a.keys(&st, client, updating)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS handshake with %v: %w", c.RemoteAddr(), err)
	}
	sc := relay.NewSealedConn(c, sealer, opener)
	sc.Peer = k // a reload checks it against the new map (rekey.go)
	return sc, s, nil
}

// errUnknownKey: the peer proved a key the site map does not list for a
// site that dials this gateway.
var errUnknownKey = errors.New("unknown key")

// keys derives the record keys of a handshake from its exporter: under
// mpi5k/3 a secret per direction, from which each key derives the next
// (docs/wire-format.md, "Key updates"); under mpi5k/2 a key and IV per
// direction for the connection's life.
func (a *peerAuth) keys(st *tls.ConnectionState, client, updating bool) (*seal.Sealer, *seal.Opener, error) {
	label, n := seal.ExporterLabel, seal.MaterialLen
	if updating {
		label, n = seal.SecretsLabel, seal.SecretsLen
	}
	km, err := st.ExportKeyingMaterial(label, seal.ExporterContext(a.mode), n)
	if err != nil {
		return nil, nil, fmt.Errorf("key export: %w", err)
	}
	defer clear(km)
	if updating {
		return seal.UpdatingKeys(suiteOf(st.CipherSuite), a.mode, km, client, a.limits)
	}
	return seal.Keys(suiteOf(st.CipherSuite), a.mode, km, client)
}

// suiteOf is the records' AEAD: ChaCha20-Poly1305 when TLS picked it,
// which Go's TLS does when either end lacks AES instructions (so both
// ends agree on it, and neither runs AES in software), else AES-256-GCM.
func suiteOf(tlsSuite uint16) seal.Suite {
	if tlsSuite == tls.TLS_CHACHA20_POLY1305_SHA256 {
		return seal.ChaCha20Poly1305
	}
	return seal.AES256GCM
}

func certsDER(cs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(cs))
	for i, c := range cs {
		out[i] = c.Raw
	}
	return out
}

// tlsRecords is the connection under TLS during the handshake. It reads
// no further than the end of the current TLS record: crypto/tls reads
// ahead when it can, and would take the peer's first relay record, sent
// right after its Finished, into its own buffer.
//
// It also bounds what a peer that has proved nothing yet can make TLS
// hold: a record announces its length in its header, and crypto/tls
// makes room for all of it then, so a record longer than
// maxHandshakeRecord fails the handshake before its body is read, and
// so do more than maxHandshakeBytes in all. Every record of a gateway's
// handshake is far smaller (the largest, a ClientHello with a post-quantum
// key share, is under 2 KB).
//
// mute drops what TLS writes: the acceptor's alerts to what is not a
// gateway's ClientHello.
type tlsRecords struct {
	net.Conn
	hdr  [5]byte
	hn   int // bytes of the record header read
	left int // bytes of the record body not yet read
	read int // bytes read in all
	mute bool
}

func (r *tlsRecords) Write(p []byte) (int, error) {
	if r.mute {
		return len(p), nil
	}
	return r.Conn.Write(p)
}

const (
	maxHandshakeRecord = 4096 // a control frame's bound (header.MaxControl)
	maxHandshakeBytes  = 16 << 10
)

var errHandshakeSize = errors.New("TLS handshake larger than a gateway's: not a gateway")

func (r *tlsRecords) Read(p []byte) (int, error) {
	if r.read >= maxHandshakeBytes {
		return 0, fmt.Errorf("%w (more than %d bytes)", errHandshakeSize, maxHandshakeBytes)
	}
	if r.left == 0 {
		n, err := r.Conn.Read(p[:min(len(p), len(r.hdr)-r.hn)])
		copy(r.hdr[r.hn:], p[:n])
		r.read += n
		if r.hn += n; r.hn == len(r.hdr) {
			r.hn, r.left = 0, int(binary.BigEndian.Uint16(r.hdr[3:]))
			if r.left > maxHandshakeRecord {
				return n, fmt.Errorf("%w (a record of %d bytes)", errHandshakeSize, r.left)
			}
		}
		return n, err
	}
	n, err := r.Conn.Read(p[:min(len(p), r.left, maxHandshakeBytes-r.read)])
	r.left -= n
	r.read += n
	return n, err
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
		if g.cfg.WANIntegrityOnly {
			g.log.Warn("--wan-encrypt=false has no effect: without gateway keys in the site map WAN records are neither encrypted nor authenticated")
		}
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
	mode := seal.ModeEncrypt
	if g.cfg.WANIntegrityOnly {
		mode = seal.ModeIntegrity
		g.log.Warn("WAN records are authenticated but not encrypted (--wan-encrypt=false): anyone on the path reads every stream; an altered byte still fails its record and is never delivered (docs/security.md)")
	}
	a, err := newPeerAuth(g.cfg.Map, g.site, key, path, mode)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	a.limits, a.fixedKeys = g.cfg.KeyUpdate, g.cfg.fixedKeys
	g.auth = a
	g.acceptTLS = a.acceptor(func(s *sitemap.Site) bool {
		ps := g.peersOf(s.ID)
		return len(ps) > 0 && !ps[0].dialer
	})
	return nil
}

// secureDial runs TLS over a dialed WAN connection (keyed maps), whose
// peer must prove a key of p's site, and returns it sealed. Keyless maps
// use c as it is.
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
		// A handshake that fails, its time up included (crypto/tls then
		// closes the connection itself), ends with a reset.
		c.SetLinger(0)
		wc, s, err := g.auth.handshake(ctx, c, g.acceptTLS, false)
		if err == nil {
			c.SetLinger(-1)
		}
		switch {
		case errors.Is(err, errUnknownKey):
			return nil, nil, "wan_auth", err
		case errors.Is(err, errWANEncrypt):
			return nil, nil, "wan_encrypt", err
		case err != nil:
			// Not TLS, not a gateway's, too slow, or ended by the
			// peer before it proved a key.
			return nil, nil, "wan_tls", err
		}
		// Any gateway host of the site proves the site's key: its HELLO
		// says which it is.
		ps := g.peersOf(s.ID)
		if len(ps) == 0 { // taken out of the map by a reload meanwhile
			wc.Close()
			return nil, nil, "wan_auth", fmt.Errorf("site %s is no longer in the site map", s.Name)
		}
		return wc, ps, "", nil
	}
	var cands []*peer
	for _, p := range g.peerList() {
		if !p.dialer && p.wan.Addr() == remote.Addr() {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil, nil, "wan_source", errors.New("source is no peer gateway in the site map")
	}
	return c, cands, "", nil
}
