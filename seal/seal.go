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
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"

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
	h := half{aead: a, mode: m}
	copy(h.iv[:], iv)
	return h, err
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
// exporter derived; dialer says which end this is.
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
		dst = dst[:start+PrefixSize+n+TagSize]
		binary.BigEndian.PutUint32(dst[start:], uint32(n+TagSize))
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

// RecordLen reads a record's length field and returns the record's size
// on the wire, prefix included.
func RecordLen(prefix []byte) (int, error) {
	l := binary.BigEndian.Uint32(prefix)
	if l == 0 {
		return 0, ErrAlert
	}
	if l <= TagSize || l > MaxRecord+TagSize {
		return 0, fmt.Errorf("%w: %d bytes after the length field (want %d..%d)", ErrRecordSize, l, TagSize+1, MaxRecord+TagSize)
	}
	return PrefixSize + int(l), nil
}

// Open checks record rec (its length field included, as RecordLen
// sized it) and returns its batch: decrypted into dst when dst has room
// for it, else in place in rec; the batch of an integrity-only record is
// always its part of rec.
func (o *Opener) Open(dst, rec []byte) ([]byte, error) {
	nonce, err := o.h.next()
	if err != nil {
		return nil, err
	}
	n := len(rec) - Overhead
	if o.h.mode == ModeIntegrity {
		if _, err := o.h.aead.Open(nil, nonce, rec[PrefixSize+n:], rec[:PrefixSize+n]); err != nil {
			return nil, ErrAuth
		}
		return rec[PrefixSize : PrefixSize+n], nil
	}
	ct := rec[PrefixSize:]
	if cap(dst) < n {
		dst = ct
	}
	pt, err := o.h.aead.Open(dst[:0], nonce, ct, rec[:PrefixSize])
	if err != nil {
		return nil, ErrAuth
	}
	return pt, nil
}

// InPlace reports whether Open of an n-byte batch leaves it in the
// record rather than in dst: always so for integrity-only records.
func (o *Opener) InPlace() bool { return o.h.mode == ModeIntegrity }
