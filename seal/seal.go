// Package seal is the WAN links' record layer (docs/wire-format.md,
// "Records"): once TLS 1.3 has authenticated two gateways and agreed on
// a secret, each direction of the link's TCP connection carries AEAD
// records sealed with keys exported from that handshake, and the relay
// writes and reads them on the raw socket (and so on its poller thread).
//
// A record is a 4-byte big-endian length L followed by L bytes: the
// sealed batch and its 16-byte tag. With encryption (ModeEncrypt) the
// batch is encrypted and the length prefix is the additional data; with
// integrity only (ModeIntegrity) the batch travels in the clear and the
// prefix and batch together are the additional data of an empty
// message, so the tag is a GMAC or Poly1305 of them. The nonce is the
// direction's 12-byte IV with the record's sequence number (from 0, one
// per record) XORed into its last 8 bytes, as in TLS 1.3: a nonce is
// never used twice under one key, and a record dropped, repeated,
// reordered or moved to the other direction fails its tag.
//
// Two formats exist, named by the TLS handshake's ALPN protocol. Under
// mpi5k/2 (Keys) a direction keeps one key for the connection's life.
// Under mpi5k/3 (UpdatingKeys) each direction's sender moves to the next
// key, derived from the current one's secret as TLS 1.3's KeyUpdate
// does, whenever the key has sealed its share of records or bytes or is
// an hour old (Limits), and flips the key phase bit, the top bit of the
// length field, in that record: the receiver derives the same key and
// switches at exactly that record. Keys are derived at both ends, never
// sent; the key before is erased, and a record of it no longer opens.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
)

// Mode is what a record protects.
type Mode uint8

const (
	// ModeEncrypt: confidentiality and integrity (the default).
	ModeEncrypt Mode = iota
	// ModeIntegrity: integrity only, for a WAN the operator already
	// protects (--wan-encrypt=false).
	ModeIntegrity
)

func (m Mode) String() string {
	if m == ModeIntegrity {
		return "integrity-only"
	}
	return "encrypted"
}

// Suite is the AEAD of a link's records.
type Suite uint8

const (
	// AES256GCM where the CPUs of both ends have AES instructions.
	AES256GCM Suite = iota
	// ChaCha20Poly1305 where one lacks them (golang.org/x/crypto).
	ChaCha20Poly1305
)

func (s Suite) String() string {
	if s == ChaCha20Poly1305 {
		return "ChaCha20-Poly1305"
	}
	return "AES-256-GCM"
}

const (
	// PrefixSize is the record's length field.
	PrefixSize = 4
	// TagSize is the AEAD tag after the batch.
	TagSize = 16
	// Overhead is what a record adds to its batch.
	Overhead = PrefixSize + TagSize
	// MaxRecord is the largest batch one record carries; a larger batch
	// is split over several records. It exceeds one bulk chunk (128 KiB)
	// and the small frames queued with it, so a batch is one record.
	MaxRecord = 256 << 10

	keyLen = 32
	ivLen  = 12
)

// ExporterLabel is the RFC 8446 exporter label the key material is
// derived with; the context is ExporterContext(mode).
const ExporterLabel = "EXPORTER-mpi5k-wan-records-v1"

// MaterialLen is how many exporter bytes Keys takes: a key and an IV for
// each direction, the dialer's first.
const MaterialLen = 2 * (keyLen + ivLen)

// SecretsLabel is the exporter label of mpi5k/3, whose keys update: it
// derives SecretsLen bytes, the first secret of each direction, the
// dialer's first. The context is ExporterContext(mode), as for mpi5k/2.
const SecretsLabel = "EXPORTER-mpi5k-wan-secrets-v1"

// SecretsLen is how many exporter bytes UpdatingKeys takes.
const SecretsLen = 2 * keyLen

// phaseBit is the key phase in an mpi5k/3 record's length field, whose
// length needs no more than 19 bits: it flips with each key update. It
// is part of the additional data, so a forged one fails the tag.
const phaseBit = 1 << 31

// Limits bound what one key seals before its sender moves to the next.
// A zero field is DefaultLimits'; a field above it is capped there.
type Limits struct {
	Records uint64        // records sealed
	Bytes   uint64        // batch bytes sealed
	Age     time.Duration // since the key's first record
}

// DefaultLimits keep each key far below AES-GCM's confidentiality limit
// (draft-irtf-cfrg-aead-limits: the advantage an attacker draws from s
// blocks sealed in q records is about (s+q+1)^2 / 2^129): 2^34 bytes
// (16 GiB, 2^30 blocks) and 2^24 records give about 2^-69 per key, where
// TLS 1.3 aims at 2^-60 (RFC 8446 §5.5: 2^24.5 full records).
// ChaCha20-Poly1305 has no such limit at this volume and takes the same,
// which costs little: an update derives three short HKDF outputs and a
// key schedule, some microseconds. The hour bounds how long a key that
// leaked from memory opens records.
var DefaultLimits = Limits{Records: 1 << 24, Bytes: 1 << 34, Age: time.Hour}

func (l Limits) orDefault() Limits {
	d := DefaultLimits
	if l.Records == 0 || l.Records > d.Records {
		l.Records = d.Records
	}
	if l.Bytes == 0 || l.Bytes > d.Bytes {
		l.Bytes = d.Bytes
	}
	if l.Age <= 0 || l.Age > d.Age {
		l.Age = d.Age
	}
	return l
}

// ExporterContext is the exporter context of mode: the two modes derive
// unrelated keys, so a record sealed in one never opens in the other.
func ExporterContext(m Mode) []byte { return []byte("mode=" + m.String()) }

// ErrAuth: a record failed its tag (altered, replayed, truncated on the
// path, or sealed with other keys).
var ErrAuth = errors.New("seal: record failed authentication")

// ErrRecordSize: a record's length field is outside 1..MaxRecord bytes
// of batch (a corrupted length, or a peer that is not a gateway).
var ErrRecordSize = errors.New("seal: record length out of range")

// ErrAlert: the peer found one of our records failing and broke the
// connection (an alert, a length field of 0).
var ErrAlert = errors.New("seal: the peer received a record that failed authentication and broke the connection")

// Alert is what a side writes when a record it received fails, before it
// closes the connection: a length field of 0, which is no record. A
// middlebox may turn the reset that follows into an orderly close; the
// alert still tells the peer the connection broke, rather than ended. It
// is not authenticated, and needs not be: whoever can write it on the
// path can reset the connection as well.
var Alert = [PrefixSize]byte{}

// ErrExhausted: the direction's sequence numbers are used up (2^64
// records); the connection must be replaced.
var ErrExhausted = errors.New("seal: record sequence numbers exhausted")

type half struct {
	aead  cipher.AEAD
	iv    [ivLen]byte
	seq   uint64
	nonce [ivLen]byte
	mode  Mode
	done  bool // seq wrapped

	// Key updates (mpi5k/3); updating is false for mpi5k/2's fixed keys.
	updating bool
	suite    Suite
	phase    uint32       // phaseBit or 0: the key phase of this key's records
	secret   [keyLen]byte // the key's secret, from which the next derives
	updates  uint64       // keys this direction has moved past
	lim      Limits       // the sealer's: when to move to the next key
	recs     uint64       // records sealed under this key
	bytes    uint64       // batch bytes sealed under this key
	since    time.Time    // when this key sealed its first record
}

func newHalf(s Suite, m Mode, key, iv []byte) (half, error) {
	var a cipher.AEAD
	var err error
	switch s {
	case AES256GCM:
		var b cipher.Block
		if b, err = aes.NewCipher(key); err == nil {
			a, err = cipher.NewGCM(b)
		}
	case ChaCha20Poly1305:
		a, err = chacha20poly1305.New(key)
	default:
		err = fmt.Errorf("seal: unknown suite %d", s)
	}
	h := half{aead: a, mode: m, suite: s}
	copy(h.iv[:], iv)
	return h, err
}

// halfOf is the key and IV of secret, as TLS 1.3 derives a traffic key
// and IV from a traffic secret (RFC 8446 §7.3).
func halfOf(s Suite, m Mode, secret []byte, lim Limits) (half, error) {
	key := expandLabel(secret, "key", keyLen)
	iv := expandLabel(secret, "iv", ivLen)
	h, err := newHalf(s, m, key, iv)
	clear(key)
	clear(iv)
	h.updating = true
	copy(h.secret[:], secret)
	h.lim = lim
	return h, err
}

// successor is the direction's next key: secret N+1 =
// HKDF-Expand-Label(secret N, "ku", "", 32), as TLS 1.3's KeyUpdate
// derives application_traffic_secret_N+1 (RFC 8446 §7.2), with the other
// key phase. The sequence numbers go on where the key before left them,
// as QUIC's packet numbers do across key phases: a record dropped at the
// end of a key leaves the next key's first record a number short, and it
// fails (TLS 1.3 restarts from 0, but signals the update with a record
// of the old key).
func (h *half) successor() (half, error) {
	secret := expandLabel(h.secret[:], "ku", keyLen)
	n, err := halfOf(h.suite, h.mode, secret, h.lim)
	clear(secret)
	n.phase = h.phase ^ phaseBit
	n.updates = h.updates + 1
	n.seq, n.done = h.seq, h.done
	return n, err
}

// erase clears the key's secret and IV and drops its AEAD. Go's AEADs
// keep their expanded key where it cannot be cleared: it goes with the
// object to the garbage collector.
func (h *half) erase() {
	clear(h.secret[:])
	clear(h.iv[:])
	clear(h.nonce[:])
	h.aead = nil
}

// expandLabel is TLS 1.3's HKDF-Expand-Label (RFC 8446 §7.1) over
// SHA-256, with the label prefix "mpi5k " instead of "tls13 ", so no
// secret of the records is ever one of TLS's own.
func expandLabel(secret []byte, label string, n int) []byte {
	l := "mpi5k " + label
	info := make([]byte, 0, 4+len(l))
	info = append(info, byte(n>>8), byte(n), byte(len(l)))
	info = append(info, l...)
	info = append(info, 0) // no context
	out, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil {
		panic("seal: " + err.Error()) // n is a constant far below 255*32
	}
	return out
}

// ageEvery: a sealer reads the clock for Age at every ageEvery-th record
// of a key only. A clock read costs about as much as the rest of a small
// record's work besides the AEAD, and a link that carries anything sends
// a keepalive a second; a key that seals fewer records outlives its Age
// by at most that many.
const ageEvery = 16

// due reports whether the record of n batch bytes about to be sealed
// must take the next key: this one has sealed its share of records or
// bytes, or has been in use for Age.
func (h *half) due(n int) bool {
	if h.recs == 0 {
		return false
	}
	return h.recs >= h.lim.Records || h.bytes+uint64(n) > h.lim.Bytes ||
		h.recs%ageEvery == 0 && time.Since(h.since) >= h.lim.Age
}

// next is the nonce of the next record, which then counts as used.
func (h *half) next() ([]byte, error) {
	if h.done {
		return nil, ErrExhausted
	}
	h.nonce = h.iv
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], h.seq)
	for i := range s {
		h.nonce[ivLen-8+i] ^= s[i]
	}
	h.seq++
	h.done = h.seq == 0
	return h.nonce[:], nil
}

// Sealer seals one direction's records. Not safe for concurrent use: a
// link has one writer at a time.
type Sealer struct{ h half }

// Opener opens the other direction's records, in order.
type Opener struct{ h half }

// Keys makes the two directions of a link from MaterialLen bytes the
// exporter derived; dialer says which end this is. Their keys never
// change (mpi5k/2).
func Keys(s Suite, m Mode, material []byte, dialer bool) (*Sealer, *Opener, error) {
	if len(material) != MaterialLen {
		return nil, nil, fmt.Errorf("seal: %d bytes of key material, want %d", len(material), MaterialLen)
	}
	d, a := material[:keyLen+ivLen], material[keyLen+ivLen:]
	if !dialer {
		d, a = a, d
	}
	w, err := newHalf(s, m, d[:keyLen], d[keyLen:])
	if err != nil {
		return nil, nil, err
	}
	r, err := newHalf(s, m, a[:keyLen], a[keyLen:])
	if err != nil {
		return nil, nil, err
	}
	return &Sealer{w}, &Opener{r}, nil
}

// UpdatingKeys makes the two directions of a link from SecretsLen bytes
// the exporter derived with SecretsLabel (mpi5k/3): the sealer moves to
// the next key whenever lim says so, and the opener follows the peer's
// sealer, each direction on its own.
func UpdatingKeys(s Suite, m Mode, secrets []byte, dialer bool, lim Limits) (*Sealer, *Opener, error) {
	if len(secrets) != SecretsLen {
		return nil, nil, fmt.Errorf("seal: %d bytes of secrets, want %d", len(secrets), SecretsLen)
	}
	d, a := secrets[:keyLen], secrets[keyLen:]
	if !dialer {
		d, a = a, d
	}
	lim = lim.orDefault()
	w, err := halfOf(s, m, d, lim)
	if err != nil {
		return nil, nil, err
	}
	r, err := halfOf(s, m, a, Limits{})
	if err != nil {
		return nil, nil, err
	}
	return &Sealer{w}, &Opener{r}, nil
}

// Updates is how many times the sealer has moved to a next key.
func (s *Sealer) Updates() uint64 { return s.h.updates }

// Updates is how many key updates of the peer the opener has followed.
func (o *Opener) Updates() uint64 { return o.h.updates }

// Len is the wire size of the records Append makes of n batch bytes.
func Len(n int) int {
	recs := (n + MaxRecord - 1) / MaxRecord
	return n + recs*Overhead
}

// Append seals the concatenation of iov as one record (several if it is
// longer than MaxRecord) appended to dst. The batch is gathered into dst
// and sealed there in place: one copy, which the encryption needs anyway
// (Go's AEADs take a contiguous message).
func (s *Sealer) Append(dst []byte, iov [][]byte) ([]byte, error) {
	total := 0
	for _, b := range iov {
		total += len(b)
	}
	if total == 0 {
		return dst, nil
	}
	if need := len(dst) + Len(total); need > cap(dst) {
		d := make([]byte, len(dst), need)
		copy(d, dst)
		dst = d
	}
	i, off := 0, 0 // position in iov
	for total > 0 {
		n := min(total, MaxRecord)
		total -= n
		start := len(dst)
		if s.h.updating {
			if err := s.update(n); err != nil {
				return dst, err
			}
		}
		dst = dst[:start+PrefixSize+n+TagSize]
		binary.BigEndian.PutUint32(dst[start:], uint32(n+TagSize)|s.h.phase)
		body := dst[start+PrefixSize : start+PrefixSize+n]
		for w := 0; w < n; {
			c := copy(body[w:], iov[i][off:])
			w += c
			if off += c; off == len(iov[i]) {
				i, off = i+1, 0
			}
		}
		nonce, err := s.h.next()
		if err != nil {
			return dst[:start], err
		}
		if s.h.mode == ModeIntegrity {
			s.h.aead.Seal(dst[start+PrefixSize+n:start+PrefixSize+n], nonce, nil, dst[start:start+PrefixSize+n])
		} else {
			s.h.aead.Seal(body[:0], nonce, body, dst[start:start+PrefixSize])
		}
	}
	return dst, nil
}

// update counts the record of n batch bytes about to be sealed against
// the key's limits, moving to the next key first when they are reached.
func (s *Sealer) update(n int) error {
	if s.h.due(n) {
		next, err := s.h.successor()
		if err != nil {
			return err
		}
		s.h.erase()
		s.h = next
	}
	if s.h.recs == 0 {
		s.h.since = time.Now()
	}
	s.h.recs++
	s.h.bytes += uint64(n)
	return nil
}

// RecordLen reads an mpi5k/2 record's length field and returns the
// record's size on the wire, prefix included.
func RecordLen(prefix []byte) (int, error) { return recordLen(prefix, false) }

// recordLen is RecordLen, with the key phase bit of mpi5k/3 records
// (updating) taken off first.
func recordLen(prefix []byte, updating bool) (int, error) {
	l := binary.BigEndian.Uint32(prefix)
	if l == 0 {
		return 0, ErrAlert
	}
	if updating {
		l &^= phaseBit
	}
	if l <= TagSize || l > MaxRecord+TagSize {
		return 0, fmt.Errorf("%w: %d bytes after the length field (want %d..%d)", ErrRecordSize, l, TagSize+1, MaxRecord+TagSize)
	}
	return PrefixSize + int(l), nil
}

// Open checks record rec (its length field included, as RecordLen
// sized it) and returns its batch: decrypted into dst when dst has room
// for it, else in place in rec; the batch of an integrity-only record is
// always its part of rec. A record of the other key phase is the first
// of the peer's next key: Open moves to that key if the record opens
// with it, and erases the current one. There is no way back: the phase
// before is the phase after next, whose key no record opens yet.
func (o *Opener) Open(dst, rec []byte) ([]byte, error) {
	if binary.BigEndian.Uint32(rec)&phaseBit != o.h.phase {
		return o.openNext(dst, rec)
	}
	return o.h.open(dst, rec)
}

// openNext opens rec with the peer's next key, which then replaces the
// current one.
func (o *Opener) openNext(dst, rec []byte) ([]byte, error) {
	if !o.h.updating {
		return nil, ErrAuth // mpi5k/2 has no phase bit: an altered length field
	}
	next, err := o.h.successor()
	if err != nil {
		return nil, err
	}
	pt, err := next.open(dst, rec)
	if err != nil {
		next.erase()
		return nil, err
	}
	o.h.erase()
	o.h = next
	return pt, nil
}

func (h *half) open(dst, rec []byte) ([]byte, error) {
	nonce, err := h.next()
	if err != nil {
		return nil, err
	}
	n := len(rec) - Overhead
	if h.mode == ModeIntegrity {
		if _, err := h.aead.Open(nil, nonce, rec[PrefixSize+n:], rec[:PrefixSize+n]); err != nil {
			return nil, ErrAuth
		}
		return rec[PrefixSize : PrefixSize+n], nil
	}
	ct := rec[PrefixSize:]
	if cap(dst) < n {
		dst = ct
	}
	pt, err := h.aead.Open(dst[:0], nonce, ct, rec[:PrefixSize])
	if err != nil {
		return nil, ErrAuth
	}
	return pt, nil
}

// InPlace reports whether Open of an n-byte batch leaves it in the
// record rather than in dst: always so for integrity-only records.
func (o *Opener) InPlace() bool { return o.h.mode == ModeIntegrity }
