package header

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unicode/utf8"
)

const (
	minEndpoint = 7  // family, port, IPv4
	maxEndpoint = 19 // family, port, IPv6
	helloFixed  = 13 // site, link index, link count, features, max payload, window, name length
)

// EndpointLen is the encoded size of ap: 7 bytes for IPv4 (including
// IPv4-mapped IPv6, which is sent unmapped) and 19 for IPv6.
func EndpointLen(ap netip.AddrPort) int {
	if ap.Addr().Unmap().Is4() || !ap.Addr().IsValid() {
		return minEndpoint
	}
	return maxEndpoint
}

// PutEndpoint encodes ap into b and returns the bytes written. An invalid
// (zero) AddrPort is written as 0.0.0.0:0, the "none" endpoint of a negative
// PEER_REPLY. IPv6 zones are not carried. It returns ErrShort if b is too small.
func PutEndpoint(b []byte, ap netip.AddrPort) (int, error) {
	a := ap.Addr().Unmap()
	n := EndpointLen(ap)
	if len(b) < n {
		return 0, fmt.Errorf("%w: endpoint needs %d bytes, have %d", ErrShort, n, len(b))
	}
	binary.BigEndian.PutUint16(b[1:3], ap.Port())
	if n == minEndpoint {
		b[0] = 4
		var v4 [4]byte // the zero Addr stays 0.0.0.0
		if a.IsValid() {
			v4 = a.As4()
		}
		copy(b[3:7], v4[:])
	} else {
		b[0] = 6
		v6 := a.As16()
		copy(b[3:19], v6[:])
	}
	return n, nil
}

// ParseEndpoint decodes one endpoint at the start of b and returns it with
// the bytes it used. It does not allocate.
func ParseEndpoint(b []byte) (netip.AddrPort, int, error) {
	if len(b) < 1 {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: empty endpoint", ErrPayload)
	}
	switch b[0] {
	case 4:
		if len(b) < minEndpoint {
			return netip.AddrPort{}, 0, fmt.Errorf("%w: IPv4 endpoint of %d bytes (want 7)", ErrPayload, len(b))
		}
		a := netip.AddrFrom4([4]byte(b[3:7]))
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[1:3])), minEndpoint, nil
	case 6:
		if len(b) < maxEndpoint {
			return netip.AddrPort{}, 0, fmt.Errorf("%w: IPv6 endpoint of %d bytes (want 19)", ErrPayload, len(b))
		}
		a := netip.AddrFrom16([16]byte(b[3:19]))
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[1:3])), maxEndpoint, nil
	}
	return netip.AddrPort{}, 0, fmt.Errorf("%w: endpoint family %d (want 4 or 6)", ErrPayload, b[0])
}

// Extension type bits and the types defined in version 1.
const (
	ExtCritical uint16 = 1 << 15
	ExtLabel    uint16 = 1 // OPEN: source process label
	ExtSession  uint16 = 2 // HELLO: the link's session, for WAN resume
	// ExtGateway (HELLO, critical): which of its site's gateway hosts the
	// sender is, when not the first. Critical: a gateway that knows one
	// gateway per site would take the link for the first one's.
	ExtGateway uint16 = 3 | ExtCritical
	// ExtResume (OPEN, and the open metadata of a gateway's MX stream to a
	// node daemon; critical): the connection's resume id. What follows the
	// OPEN is framed by the two node daemons' resume records
	// (docs/wire-format.md, "Resumable streams"), which a rank could not
	// read.
	ExtResume uint16 = 4 | ExtCritical
	// ExtTrunk (HELLO): the sender's --wan-trunk preset (TrunkShared or
	// TrunkParallel) and whether it runs auto, which takes whatever preset
	// the site pair agrees on (docs/wire-format.md, "Trunk agreement").
	// Not critical: a receiver that does not know it checks the link
	// count and features, as before.
	ExtTrunk uint16 = 5
	// MaxGatewayIndex is the highest gateway index (sitemap.MaxGateways - 1).
	MaxGatewayIndex = 15
	MaxLabel        = 64
)

// walkExt calls fn for every extension in b. Unknown critical extensions
// are rejected by the caller's fn returning ErrCritical; walkExt itself only
// checks the TLV framing.
func walkExt(b []byte, fn func(typ uint16, val []byte) error) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return fmt.Errorf("%w: truncated extension header (%d bytes)", ErrPayload, len(b))
		}
		typ := binary.BigEndian.Uint16(b[0:2])
		n := int(binary.BigEndian.Uint16(b[2:4]))
		if len(b)-4 < n {
			return fmt.Errorf("%w: extension %#04x of %d bytes, only %d left", ErrPayload, typ, n, len(b)-4)
		}
		if err := fn(typ, b[4:4+n]); err != nil {
			return err
		}
		b = b[4+n:]
	}
	return nil
}

func unknownExt(typ uint16) error {
	if typ&ExtCritical != 0 {
		return fmt.Errorf("%w: %#04x", ErrCritical, typ)
	}
	return nil // skipped, as the spec requires
}

func appendExt(b []byte, typ uint16, val []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(val)))
	return append(b, val...)
}

// HELLO feature bits (the byte after the link count).
const (
	// FeatureTrunk: the sender's links to this peer form one trunk. Stream
	// ids are unique across all of them, a stream's DATA may arrive on any
	// of them as DATA_AT (with its stream offset), and HALF_CLOSE carries
	// the final offset.
	FeatureTrunk uint8 = 1 << 0
	// FeatureExpress: the trunk's last link (index LinkCount-1) is an
	// express link that carries small frames only.
	FeatureExpress uint8 = 1 << 1
	// FeatureClamp: the sender applies CLAMP frames to its socket of the
	// link they arrive on (TCP_WINDOW_CLAMP).
	FeatureClamp uint8 = 1 << 2
	// FeatureRenew: the express link may be replaced while it works (a
	// fresh TCP connection for a congestion window that losses have cut):
	// the dialer connects a new one, and resumes the link on it (with
	// FeatureResume: HELLO Renew) or both ends end the old one with
	// RETIRE; the acceptor may ask for a renewal with RENEW.
	FeatureRenew uint8 = 1 << 3
	// FeaturePad: the sender discards PAD frames, which a gateway writes
	// to give a new link's congestion control a measure of the path
	// before messages depend on it.
	FeaturePad uint8 = 1 << 4
	// FeatureResume: a link that breaks is resumed on a new connection
	// without losing or repeating a byte. Both ends keep what they wrote
	// until the peer ACKs it, and a reconnecting HELLO carries the link's
	// session (extension ExtSession) and the bytes received so far.
	FeatureResume uint8 = 1 << 5
	// FeatureQuiet: the sender stops its keepalives (PING, ACK) on a link
	// with no streams that carries nothing but keepalives, and lets its
	// kernel's TCP keepalive watch the connection instead; it still
	// answers every PING.
	FeatureQuiet uint8 = 1 << 6
	// FeatureNodeResume: the sender delivers streams to node daemons (its
	// LAN transport is MX), so it takes an OPEN with ExtResume and passes
	// the id on to the destination's daemon.
	FeatureNodeResume uint8 = 1 << 7
	knownFeatures           = FeatureTrunk | FeatureExpress | FeatureClamp | FeatureRenew | FeaturePad | FeatureResume | FeatureQuiet | FeatureNodeResume
)

// The presets of ExtTrunk's value, whose bit trunkAutoBit says the
// sender runs --wan-trunk auto.
const (
	TrunkShared   uint8 = 1
	TrunkParallel uint8 = 2
	trunkAutoBit  uint8 = 0x80
)

// sessionLen is the size of the ExtSession value: u64 session, u64 bytes
// received, u8 flags (bit 0: resume, bit 1: renew).
const sessionLen = 17

// Hello is the body of HELLO, the first frame each side of a WAN link sends.
type Hello struct {
	SiteID     uint8
	LinkIndex  uint8  // which of the LinkCount parallel links this is
	LinkCount  uint8  // links per site pair of the sender, the express link included
	Features   uint8  // Feature* bits
	MaxPayload uint32 // largest DATA payload the sender accepts
	Window     uint32 // initial credit the sender grants on every new stream
	Name       string // sender's site name, 1..255 bytes
	// Session (extension ExtSession, with FeatureResume): a random id the
	// sender gives the link when it starts, never 0. With Resume the HELLO
	// asks to continue (dialer) or continues (acceptor) the link of that
	// session on this connection, and Received is how many bytes of the
	// link the sender has received whole: the peer resends from there.
	Session  uint64
	Received uint64
	Resume   bool
	// Renew (with Resume): the dialer resumes a link that still works, on
	// a fresh connection, to renew its congestion window (FeatureRenew):
	// the acceptor ends the old connection as planned, not as a failure.
	Renew bool
	// Gateway (extension ExtGateway, sent when not 0): the sender's index
	// among its site's gateway hosts (sitemap.Site.Gateways).
	Gateway uint8
	// Trunk (extension ExtTrunk, sent when not 0): the sender's preset,
	// TrunkShared or TrunkParallel; with TrunkAuto the one its
	// --wan-trunk auto picked, and it takes the preset the pair agrees
	// on. LinkCount and Features are the links of the preset the sender
	// runs with this peer now.
	Trunk     uint8
	TrunkAuto bool
}

// AppendHello appends the encoded body of h to b.
func AppendHello(b []byte, h *Hello) ([]byte, error) {
	if err := h.check(); err != nil {
		return b, err
	}
	b = append(b, h.SiteID, h.LinkIndex, h.LinkCount, h.Features)
	b = binary.BigEndian.AppendUint32(b, h.MaxPayload)
	b = binary.BigEndian.AppendUint32(b, h.Window)
	b = append(b, byte(len(h.Name)))
	b = append(b, h.Name...)
	if h.Session != 0 {
		var v [sessionLen]byte
		binary.BigEndian.PutUint64(v[0:8], h.Session)
		binary.BigEndian.PutUint64(v[8:16], h.Received)
		if h.Resume {
			v[16] = 1
		}
		if h.Renew {
			v[16] |= 2
		}
		b = appendExt(b, ExtSession, v[:])
	}
	if h.Gateway != 0 {
		b = appendExt(b, ExtGateway, []byte{h.Gateway})
	}
	if h.Trunk != 0 {
		v := h.Trunk
		if h.TrunkAuto {
			v |= trunkAutoBit
		}
		b = appendExt(b, ExtTrunk, []byte{v})
	}
	return b, nil
}

func (h *Hello) check() error {
	switch {
	case h.SiteID == 0:
		return fmt.Errorf("%w: HELLO site id 0", ErrPayload)
	case h.LinkCount == 0 || h.LinkIndex >= h.LinkCount:
		return fmt.Errorf("%w: HELLO link %d of %d", ErrPayload, h.LinkIndex, h.LinkCount)
	case h.MaxPayload == 0 || h.MaxPayload > MaxPayload:
		return fmt.Errorf("%w: HELLO max payload %d (want 1..%d)", ErrPayload, h.MaxPayload, MaxPayload)
	case h.Window == 0:
		return fmt.Errorf("%w: HELLO initial window 0", ErrPayload)
	case h.Features&^knownFeatures != 0:
		return fmt.Errorf("%w: HELLO feature bits %#02x (known: %#02x)", ErrPayload, h.Features, knownFeatures)
	case h.Features&FeatureExpress != 0 && (h.Features&FeatureTrunk == 0 || h.LinkCount < 2):
		return fmt.Errorf("%w: HELLO express link without a trunk of >= 2 links", ErrPayload)
	case h.Features&FeatureRenew != 0 && h.Features&FeatureExpress == 0:
		return fmt.Errorf("%w: HELLO renewal without an express link", ErrPayload)
	case len(h.Name) == 0 || len(h.Name) > 255:
		return fmt.Errorf("%w: HELLO name of %d bytes (want 1..255)", ErrPayload, len(h.Name))
	case h.Session == 0 && (h.Resume || h.Received != 0):
		return fmt.Errorf("%w: HELLO resume without a session", ErrPayload)
	case h.Renew && (!h.Resume || h.Features&FeatureRenew == 0):
		return fmt.Errorf("%w: HELLO renewal without resume or feature RENEW", ErrPayload)
	case h.Gateway > MaxGatewayIndex:
		return fmt.Errorf("%w: HELLO gateway index %d (want 0..%d)", ErrPayload, h.Gateway, MaxGatewayIndex)
	case h.Trunk > TrunkParallel || h.Trunk == 0 && h.TrunkAuto:
		return fmt.Errorf("%w: HELLO trunk preset %d auto %v (want 1 or 2, auto only with one)", ErrPayload, h.Trunk, h.TrunkAuto)
	}
	return nil
}

// ParseHello decodes and validates a HELLO body.
func ParseHello(p []byte) (Hello, error) {
	var h Hello
	if len(p) < helloFixed {
		return h, fmt.Errorf("%w: HELLO body of %d bytes (want >= %d)", ErrPayload, len(p), helloFixed)
	}
	h.SiteID, h.LinkIndex, h.LinkCount, h.Features = p[0], p[1], p[2], p[3]
	h.MaxPayload = binary.BigEndian.Uint32(p[4:8])
	h.Window = binary.BigEndian.Uint32(p[8:12])
	n := int(p[12])
	if len(p)-helloFixed < n {
		return h, fmt.Errorf("%w: HELLO name of %d bytes, only %d left", ErrPayload, n, len(p)-helloFixed)
	}
	h.Name = string(p[helloFixed : helloFixed+n])
	if err := h.check(); err != nil {
		return h, err
	}
	err := walkExt(p[helloFixed+n:], func(typ uint16, v []byte) error {
		if typ == ExtGateway {
			// 0 is sent by leaving the extension out: one encoding per HELLO.
			if len(v) != 1 || v[0] == 0 || v[0] > MaxGatewayIndex {
				return fmt.Errorf("%w: HELLO gateway extension %x (want one byte 1..%d)", ErrPayload, v, MaxGatewayIndex)
			}
			h.Gateway = v[0]
			return nil
		}
		if typ == ExtTrunk {
			if len(v) != 1 || v[0]&^trunkAutoBit != TrunkShared && v[0]&^trunkAutoBit != TrunkParallel {
				return fmt.Errorf("%w: HELLO trunk extension %x (want one byte: 1 or 2, with bit 0x80 for auto)", ErrPayload, v)
			}
			h.Trunk, h.TrunkAuto = v[0]&^trunkAutoBit, v[0]&trunkAutoBit != 0
			return nil
		}
		if typ != ExtSession {
			return unknownExt(typ)
		}
		if len(v) != sessionLen {
			return fmt.Errorf("%w: HELLO session extension of %d bytes (want %d)", ErrPayload, len(v), sessionLen)
		}
		if v[16] != 0 && v[16] != 1 && v[16] != 3 {
			return fmt.Errorf("%w: HELLO session flags %#02x (want 0, 1, or 3: renew only with resume)", ErrPayload, v[16])
		}
		h.Session = binary.BigEndian.Uint64(v[0:8])
		h.Received = binary.BigEndian.Uint64(v[8:16])
		h.Resume, h.Renew = v[16]&1 != 0, v[16]&2 != 0
		if h.Session == 0 {
			return fmt.Errorf("%w: HELLO session 0", ErrPayload)
		}
		return nil
	})
	return h, err
}

// Open is the body of OPEN.
type Open struct {
	Dst   netip.AddrPort // what the application passed to connect()
	Src   netip.AddrPort // the application's own end
	Label string         // optional source process label (extension 1)
	// Resume (extension ExtResume), when not zero: the node daemons at
	// both ends frame the stream's bytes so that it survives the loss of a
	// gateway host.
	Resume ResumeID
}

// ResumeID names a resumable connection end to end: random, chosen by the
// opening node daemon; the zero id means none.
type ResumeID [16]byte

// IsZero tells whether id names no connection.
func (id ResumeID) IsZero() bool { return id == ResumeID{} }

// AppendOpen appends the encoded body of o to b.
func AppendOpen(b []byte, o *Open) ([]byte, error) {
	if !o.Dst.IsValid() || !o.Src.IsValid() {
		return b, fmt.Errorf("%w: OPEN needs valid endpoints (dst %v, src %v)", ErrPayload, o.Dst, o.Src)
	}
	if len(o.Label) > MaxLabel || !utf8.ValidString(o.Label) {
		return b, fmt.Errorf("%w: OPEN label must be UTF-8 of at most %d bytes", ErrPayload, MaxLabel)
	}
	var ep [maxEndpoint]byte
	n, _ := PutEndpoint(ep[:], o.Dst)
	b = append(b, ep[:n]...)
	n, _ = PutEndpoint(ep[:], o.Src)
	b = append(b, ep[:n]...)
	if o.Label != "" {
		b = appendExt(b, ExtLabel, []byte(o.Label))
	}
	if !o.Resume.IsZero() {
		b = appendExt(b, ExtResume, o.Resume[:])
	}
	return b, nil
}

// ParseOpen decodes an OPEN body. It allocates only for a label.
func ParseOpen(p []byte) (Open, error) {
	var o Open
	dst, n, err := ParseEndpoint(p)
	if err != nil {
		return o, fmt.Errorf("OPEN destination: %w", err)
	}
	src, m, err := ParseEndpoint(p[n:])
	if err != nil {
		return o, fmt.Errorf("OPEN source: %w", err)
	}
	o.Dst, o.Src = dst, src
	err = walkExt(p[n+m:], func(typ uint16, val []byte) error {
		if typ == ExtLabel {
			if len(val) > MaxLabel || !utf8.Valid(val) {
				return fmt.Errorf("%w: OPEN label must be UTF-8 of at most %d bytes", ErrPayload, MaxLabel)
			}
			o.Label = string(val)
			return nil
		}
		if typ == ExtResume {
			return parseResume(val, &o.Resume)
		}
		return unknownExt(typ)
	})
	return o, err
}

func parseResume(val []byte, id *ResumeID) error {
	if len(val) != len(id) || ResumeID(val).IsZero() {
		return fmt.Errorf("%w: resume id of %d bytes or zero (want %d, not all zero)", ErrPayload, len(val), len(id))
	}
	*id = ResumeID(val)
	return nil
}

// PeerQuery is the body of PEER_QUERY: the connection as the accepting
// rank sees it.
type PeerQuery struct {
	Seen  netip.AddrPort // the peer address accept() returned (a gateway's)
	Local netip.AddrPort // the rank's own end of that connection
}

// AppendPeerQuery appends the encoded body of q to b.
func AppendPeerQuery(b []byte, q *PeerQuery) []byte {
	var ep [maxEndpoint]byte
	n, _ := PutEndpoint(ep[:], q.Seen)
	b = append(b, ep[:n]...)
	n, _ = PutEndpoint(ep[:], q.Local)
	return append(b, ep[:n]...)
}

// ParsePeerQuery decodes a PEER_QUERY body; nothing may follow the two
// endpoints.
func ParsePeerQuery(p []byte) (PeerQuery, error) {
	var q PeerQuery
	a, n, err := ParseEndpoint(p)
	if err != nil {
		return q, fmt.Errorf("PEER_QUERY seen: %w", err)
	}
	b, m, err := ParseEndpoint(p[n:])
	if err != nil {
		return q, fmt.Errorf("PEER_QUERY local: %w", err)
	}
	if n+m != len(p) {
		return q, fmt.Errorf("%w: PEER_QUERY has %d trailing bytes", ErrPayload, len(p)-n-m)
	}
	q.Seen, q.Local = a, b
	return q, nil
}

// PeerReply is the body of PEER_REPLY.
type PeerReply struct {
	Found  bool
	SiteID uint8          // site of the true source (0 when not found)
	Source netip.AddrPort // the true source (0.0.0.0:0 when not found)
}

// AppendPeerReply appends the encoded body of r to b.
func AppendPeerReply(b []byte, r *PeerReply) []byte {
	f := byte(0)
	if r.Found {
		f = 1
	}
	b = append(b, f, r.SiteID)
	var ep [maxEndpoint]byte
	n, _ := PutEndpoint(ep[:], r.Source)
	return append(b, ep[:n]...)
}

// ParsePeerReply decodes a PEER_REPLY body.
func ParsePeerReply(p []byte) (PeerReply, error) {
	var r PeerReply
	if len(p) < 2 {
		return r, fmt.Errorf("%w: PEER_REPLY of %d bytes", ErrPayload, len(p))
	}
	if p[0] > 1 {
		return r, fmt.Errorf("%w: PEER_REPLY found=%d (want 0 or 1)", ErrPayload, p[0])
	}
	src, n, err := ParseEndpoint(p[2:])
	if err != nil {
		return r, fmt.Errorf("PEER_REPLY source: %w", err)
	}
	if 2+n != len(p) {
		return r, fmt.Errorf("%w: PEER_REPLY has %d trailing bytes", ErrPayload, len(p)-2-n)
	}
	r.Found, r.SiteID, r.Source = p[0] == 1, p[1], src
	return r, nil
}

// LISTEN tells a site's gateway that a rank of the node listens on a TCP
// port (body: u16 port); its answer, LISTEN_REPLY, carries one of these
// codes (body: u8). Both go on a LAN control connection, the request id
// in the stream field.
const (
	ListenOK         uint8 = 0 // registered while the control connection stays open
	ListenPrivileged uint8 = 1 // refused: ports below 1024 are never a rank's
	ListenLimit      uint8 = 2 // refused: the connection registered too many ports
	ListenPort       uint8 = 3 // refused: outside the ports the gateway lets ranks register (--lan-listen-ports)
	ListenOwner      uint8 = 4 // refused by the node daemon: the port is not the asking user's
)

// AppendListen appends the body of LISTEN for port to b.
func AppendListen(b []byte, port uint16) []byte { return binary.BigEndian.AppendUint16(b, port) }

// ParseListen decodes a LISTEN body: a port, never 0.
func ParseListen(p []byte) (uint16, error) {
	if len(p) != 2 {
		return 0, fmt.Errorf("%w: LISTEN of %d bytes (want 2)", ErrPayload, len(p))
	}
	port := binary.BigEndian.Uint16(p)
	if port == 0 {
		return 0, fmt.Errorf("%w: LISTEN of port 0", ErrPayload)
	}
	return port, nil
}

// AppendEndpointPair appends two endpoints, from then to: the open
// metadata of an MX stream between a node daemon and its gateway
// (docs/mx-wire-format.md), the dialer's end and the end it dials.
func AppendEndpointPair(b []byte, from, to netip.AddrPort) ([]byte, error) {
	n := len(b)
	b = append(b, make([]byte, EndpointLen(from)+EndpointLen(to))...)
	m, err := PutEndpoint(b[n:], from)
	if err != nil {
		return nil, err
	}
	if _, err := PutEndpoint(b[n+m:], to); err != nil {
		return nil, err
	}
	return b, nil
}

// AppendStreamMeta appends the open metadata of a gateway's MX stream to a
// node daemon: AppendEndpointPair's, then ExtResume when resume is not
// zero.
func AppendStreamMeta(b []byte, from, to netip.AddrPort, resume ResumeID) ([]byte, error) {
	b, err := AppendEndpointPair(b, from, to)
	if err == nil && !resume.IsZero() {
		b = appendExt(b, ExtResume, resume[:])
	}
	return b, err
}

// ParseStreamMeta decodes what AppendStreamMeta wrote.
func ParseStreamMeta(b []byte) (from, to netip.AddrPort, resume ResumeID, err error) {
	from, n, err := ParseEndpoint(b)
	if err != nil {
		return
	}
	to, m, err := ParseEndpoint(b[n:])
	if err != nil {
		return
	}
	err = walkExt(b[n+m:], func(typ uint16, val []byte) error {
		if typ == ExtResume {
			return parseResume(val, &resume)
		}
		return unknownExt(typ)
	})
	return
}

// ParseEndpointPair decodes what AppendEndpointPair wrote; bytes after the
// two endpoints are an error.
func ParseEndpointPair(b []byte) (from, to netip.AddrPort, err error) {
	from, n, err := ParseEndpoint(b)
	if err != nil {
		return from, to, err
	}
	to, m, err := ParseEndpoint(b[n:])
	if err == nil && n+m != len(b) {
		err = fmt.Errorf("%w: %d bytes after the two endpoints", ErrPayload, len(b)-n-m)
	}
	return from, to, err
}
