package seal

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"testing"
)

func material(t testing.TB) []byte {
	km := make([]byte, MaterialLen)
	if _, err := rand.Read(km); err != nil {
		t.Fatal(err)
	}
	return km
}

// pair is the dialer's sealer and the acceptor's opener of one direction.
func pair(t testing.TB, s Suite, m Mode) (*Sealer, *Opener) {
	km := material(t)
	w, _, err := Keys(s, m, km, true)
	if err != nil {
		t.Fatal(err)
	}
	_, r, err := Keys(s, m, km, false)
	if err != nil {
		t.Fatal(err)
	}
	return w, r
}

var suites = []Suite{AES256GCM, ChaCha20Poly1305}
var modes = []Mode{ModeEncrypt, ModeIntegrity}

// stream is a byte source read in pieces of at most step bytes (0: all).
type stream struct {
	b    []byte
	step int
}

func (s *stream) read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if s.step > 0 {
		n = min(n, s.step)
	}
	n = copy(p, s.b[:min(n, len(s.b))])
	s.b = s.b[n:]
	return n, nil
}

// readAll reads batches with reads of size sz until the stream ends.
func readAll(r *Reader, src *stream, sz int) ([]byte, error) {
	var out []byte
	p := make([]byte, sz)
	for {
		n, err := r.Read(p, src.read)
		out = append(out, p[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// TestRoundTrip: batches of every size class, gathered from several
// slices and split over records past MaxRecord, come back whole and in
// order through reads of any size on a stream that delivers any number
// of bytes at a time, in both suites and modes. Encrypted records do not
// carry the batch in the clear; integrity-only ones do.
func TestRoundTrip(t *testing.T) {
	rng := mrand.New(mrand.NewPCG(1, 2))
	sizes := []int{1, 12, 100, 16 << 10, 128<<10 + 12, MaxRecord, MaxRecord + 1, 3*MaxRecord + 77}
	for _, s := range suites {
		for _, m := range modes {
			w, o := pair(t, s, m)
			var wire, want []byte
			var err error
			for _, n := range sizes {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				iov := [][]byte{b[:n/3], {}, b[n/3 : n/2], b[n/2:]}
				before := len(wire)
				if wire, err = w.Append(wire, iov); err != nil {
					t.Fatal(err)
				}
				if got := len(wire) - before; got != Len(n) {
					t.Fatalf("%v %v: %d bytes sealed to %d, Len says %d", s, m, n, got, Len(n))
				}
				if n >= 16<<10 && bytes.Contains(wire[before:], b[:4<<10]) != (m == ModeIntegrity) {
					t.Fatalf("%v %v: batch in the clear on the wire: %v", s, m, m == ModeEncrypt)
				}
				want = append(want, b...)
			}
			for _, step := range []int{0, 1, 7, 4096} {
				for _, rsz := range []int{13, 64 << 10, 1 << 20} {
					if (step == 1 || step == 7) && rsz != 13 {
						continue // slow, and no new case
					}
					_, o2 := pair(t, s, m)
					*o2 = *o // the same keys, sequence numbers from 0
					got, err := readAll(NewReader(o2), &stream{b: wire, step: step}, rsz)
					if err != nil {
						t.Fatalf("%v %v step %d read %d: %v", s, m, step, rsz, err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("%v %v step %d read %d: %d bytes back, want %d (or different)", s, m, step, rsz, len(got), len(want))
					}
				}
			}
		}
	}
}

// TestNonces: each record takes the next sequence number, so the same
// batch never seals to the same bytes twice; the two directions differ;
// a record opened out of order, twice, or in the other direction fails.
func TestNonces(t *testing.T) {
	km := material(t)
	dw, dr, _ := Keys(AES256GCM, ModeEncrypt, km, true)
	aw, ar, _ := Keys(AES256GCM, ModeEncrypt, km, false)
	msg := [][]byte{[]byte("the same batch")}
	r1, _ := dw.Append(nil, msg)
	r2, _ := dw.Append(nil, msg)
	a1, _ := aw.Append(nil, msg)
	if bytes.Equal(r1, r2) || bytes.Equal(r1, a1) {
		t.Fatal("a batch sealed twice, or in both directions, gave the same record")
	}
	if dw.h.seq != 2 || aw.h.seq != 1 {
		t.Fatalf("sequence numbers %d and %d, want 2 and 1", dw.h.seq, aw.h.seq)
	}
	if _, err := ar.Open(nil, bytes.Clone(r2)); !errors.Is(err, ErrAuth) {
		t.Fatalf("the second record opened first: %v", err)
	}
	if _, err := dr.Open(nil, bytes.Clone(r1)); !errors.Is(err, ErrAuth) {
		t.Fatalf("a record opened by its own direction's keys: %v", err)
	}
	_, ar2, _ := Keys(AES256GCM, ModeEncrypt, km, false)
	if p, err := ar2.Open(nil, bytes.Clone(r1)); err != nil || string(p) != "the same batch" {
		t.Fatalf("record 0: %q %v", p, err)
	}
	if _, err := ar2.Open(nil, bytes.Clone(r1)); !errors.Is(err, ErrAuth) {
		t.Fatalf("a replayed record opened: %v", err)
	}
	// The sequence number never wraps into a used nonce.
	dw.h.seq = ^uint64(0)
	if _, err := dw.Append(nil, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := dw.Append(nil, msg); !errors.Is(err, ErrExhausted) {
		t.Fatalf("after 2^64 records: %v, want ErrExhausted", err)
	}
}

// TestTamper: flipping any one bit of a record (length field, batch or
// tag) makes it fail, in both suites and modes; no batch byte of a
// failed record is returned, and the Reader stays failed.
func TestTamper(t *testing.T) {
	for _, s := range suites {
		for _, m := range modes {
			w, o := pair(t, s, m)
			rec, _ := w.Append(nil, [][]byte{bytes.Repeat([]byte("x"), 300)})
			for bit := 0; bit < 8*len(rec); bit += 7 {
				bad := bytes.Clone(rec)
				bad[bit/8] ^= 1 << (bit % 8)
				o2 := *o
				r := NewReader(&o2)
				src := &stream{b: bad}
				p := make([]byte, 1000)
				n, err := r.Read(p, src.read)
				if n != 0 || !IsRecordError(err) && err != io.ErrUnexpectedEOF {
					t.Fatalf("%v %v bit %d: read %d bytes, err %v", s, m, bit, n, err)
				}
				if err == io.ErrUnexpectedEOF {
					continue // a longer length: the record is cut short
				}
				if n, err2 := r.Read(p, (&stream{b: rec}).read); n != 0 || err2 != err {
					t.Fatalf("%v %v bit %d: a failed Reader read %d bytes, err %v", s, m, bit, n, err2)
				}
			}
		}
	}
}

// TestTruncated: a stream that ends inside a record is io.ErrUnexpectedEOF
// and returns nothing of it; one that ends between records is io.EOF.
func TestTruncated(t *testing.T) {
	w, o := pair(t, AES256GCM, ModeEncrypt)
	rec, _ := w.Append(nil, [][]byte{[]byte("whole")})
	rec, _ = w.Append(rec, [][]byte{[]byte("cut")})
	for cut := 1; cut < Len(3); cut++ {
		o2 := *o
		got, err := readAll(NewReader(&o2), &stream{b: rec[:len(rec)-cut]}, 100)
		if err != io.ErrUnexpectedEOF || string(got) != "whole" {
			t.Fatalf("cut %d: %q %v", cut, got, err)
		}
	}
	o2 := *o
	if got, err := readAll(NewReader(&o2), &stream{b: rec}, 100); err != nil || string(got) != "wholecut" {
		t.Fatalf("whole stream: %q %v", got, err)
	}
}

// TestRecordSize: a length field past MaxRecord (or too short to hold a
// tag) is refused before any of the record is buffered; 0 is the alert.
func TestRecordSize(t *testing.T) {
	_, o := pair(t, AES256GCM, ModeEncrypt)
	for _, l := range []uint32{1, TagSize, MaxRecord + TagSize + 1, 1 << 31} {
		var b [PrefixSize]byte
		binary.BigEndian.PutUint32(b[:], l)
		o2 := *o
		n, err := NewReader(&o2).Read(make([]byte, 10), (&stream{b: b[:]}).read)
		if n != 0 || !errors.Is(err, ErrRecordSize) {
			t.Fatalf("length %d: %d %v, want ErrRecordSize", l, n, err)
		}
	}
	o2 := *o
	if _, err := NewReader(&o2).Read(make([]byte, 10), (&stream{b: Alert[:]}).read); !errors.Is(err, ErrAlert) || !IsRecordError(err) {
		t.Fatalf("the alert: %v", err)
	}
	if _, err := RecordLen([]byte{0, 4, 0, 16}); err != nil {
		t.Fatalf("a MaxRecord record refused: %v", err)
	}
}

// TestModesDiffer: keys derived for one mode never open the other's
// records (the exporter context names the mode).
func TestModesDiffer(t *testing.T) {
	if bytes.Equal(ExporterContext(ModeEncrypt), ExporterContext(ModeIntegrity)) {
		t.Fatal("both modes have the same exporter context")
	}
	km := material(t)
	w, _, _ := Keys(AES256GCM, ModeIntegrity, km, true)
	_, r, _ := Keys(AES256GCM, ModeEncrypt, km, false)
	rec, _ := w.Append(nil, [][]byte{[]byte("integrity only")})
	if _, err := r.Open(nil, rec); !errors.Is(err, ErrAuth) {
		t.Fatalf("an integrity-only record opened as an encrypted one: %v", err)
	}
}

// FuzzReader: whatever bytes arrive, the Reader returns only batches of
// records that authenticate (here: none, as the fuzzer holds no key,
// except the seeds' own) and never panics or buffers past its limit,
// under mpi5k/2's fixed keys and mpi5k/3's updating ones (a new key every
// two records: the fuzzer flips phase bits). Seeds: valid records of
// both modes and formats, a truncated one, an alert and an oversized
// length.
func FuzzReader(f *testing.F) {
	km := bytes.Repeat([]byte{7}, MaterialLen)
	keys := func(m Mode, updating, dialer bool) (*Sealer, *Opener) {
		if updating {
			w, r, _ := UpdatingKeys(AES256GCM, m, km[:SecretsLen], dialer, Limits{Records: 2})
			return w, r
		}
		w, r, _ := Keys(AES256GCM, m, km, dialer)
		return w, r
	}
	for _, updating := range []bool{false, true} {
		flag := uint8(0)
		if updating {
			flag = 2
		}
		seedW, _ := keys(ModeEncrypt, updating, true)
		good, _ := seedW.Append(nil, [][]byte{[]byte("seed batch")})
		good, _ = seedW.Append(good, [][]byte{bytes.Repeat([]byte{1}, 3000)})
		good, _ = seedW.Append(good, [][]byte{[]byte("the next key")})
		iw, _ := keys(ModeIntegrity, updating, true)
		integ, _ := iw.Append(nil, [][]byte{[]byte("clear seed")})
		f.Add(good, flag)
		f.Add(integ, flag|1)
		f.Add(good[:len(good)-5], flag)
	}
	f.Add(Alert[:], uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3}, uint8(0))
	f.Add([]byte{0x80, 0, 0, 0, 1, 2, 3}, uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, flags uint8) {
		m, updating := Mode(flags%2), flags&2 != 0
		_, o := keys(m, updating, false)
		r := NewReader(o)
		src := &stream{b: data, step: 1 + len(data)%5}
		p := make([]byte, 1+len(data)%700)
		var got []byte
		for {
			n, err := r.Read(p, src.read)
			got = append(got, p[:n]...)
			if err != nil {
				break
			}
			if n == 0 {
				t.Fatal("Read returned 0 bytes and no error")
			}
		}
		if len(got) > len(data) {
			t.Fatalf("%d batch bytes from %d input bytes", len(got), len(data))
		}
		// Whatever came back is the batch of records sealed with the
		// seed keys: sealing it again gives a prefix of the input.
		if len(got) > 0 {
			w, _ := keys(m, updating, true)
			if !authenticPrefix(w, got, data) {
				t.Fatalf("returned %d bytes that no sealed record of the input carries", len(got))
			}
		}
	})
}

// authenticPrefix reports whether data begins with records sealed by w
// whose batches concatenate to got.
func authenticPrefix(w *Sealer, got, data []byte) bool {
	for len(got) > 0 {
		if len(data) < PrefixSize {
			return false
		}
		n, err := recordLen(data, w.h.updating)
		if err != nil || n > len(data) {
			return false
		}
		b := n - Overhead
		if b > len(got) {
			return false
		}
		rec, _ := w.Append(nil, [][]byte{got[:b]})
		if !bytes.Equal(rec, data[:n]) {
			return false
		}
		got, data = got[b:], data[n:]
	}
	return true
}

// BenchmarkSeal: sealing one bulk batch (a frame header and a 128 KiB
// chunk), and opening it, per suite and mode; the copy row is the gather
// alone, the floor of any record layer on Go's contiguous AEADs.
func BenchmarkSeal(b *testing.B) {
	hdr, chunk := make([]byte, 12), make([]byte, 128<<10)
	iov := [][]byte{hdr, chunk}
	b.Run("copy", func(b *testing.B) {
		out := make([]byte, Len(len(hdr)+len(chunk)))
		b.SetBytes(int64(len(chunk)))
		for b.Loop() {
			n := copy(out[PrefixSize:], hdr)
			copy(out[PrefixSize+n:], chunk)
		}
	})
	for _, s := range suites {
		for _, m := range modes {
			w, o := pair(b, s, m)
			var out []byte
			b.Run("seal/"+s.String()+"/"+m.String(), func(b *testing.B) {
				b.SetBytes(int64(len(chunk)))
				for b.Loop() {
					out, _ = w.Append(out[:0], iov)
				}
			})
			rec, _ := w.Append(nil, iov)
			dst := make([]byte, len(rec))
			b.Run("open/"+s.String()+"/"+m.String(), func(b *testing.B) {
				b.SetBytes(int64(len(chunk)))
				for b.Loop() {
					o.h.seq = w.h.seq - 1
					if _, err := o.Open(dst, rec); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRecord: sealing and opening one record per op, in lockstep as
// a link's two ends do, for a small batch (a message's frame, where the
// per-record work shows) and a bulk one: mpi5k/2's fixed keys, mpi5k/3's
// updating ones between updates (the limits and phase checks), and
// mpi5k/3 moving to a new key at every record (what an update costs).
func BenchmarkRecord(b *testing.B) {
	formats := []struct {
		name string
		lim  *Limits
	}{{"mpi5k-2", nil}, {"mpi5k-3", &Limits{}}, {"mpi5k-3-update-each", &Limits{Records: 1}}}
	for _, f := range formats {
		for _, size := range []int{64, 128 << 10} {
			if f.name == "mpi5k-3-update-each" && size > 64 {
				continue
			}
			for _, s := range suites {
				w, o := pair(b, s, ModeEncrypt)
				if f.lim != nil {
					w, o = updatingPair(b, s, ModeEncrypt, *f.lim)
				}
				iov := [][]byte{make([]byte, size)}
				var rec []byte
				dst := make([]byte, size)
				b.Run(fmt.Sprintf("%s/%s/%d", f.name, s, size), func(b *testing.B) {
					b.SetBytes(int64(size))
					b.ReportAllocs()
					for b.Loop() {
						rec, _ = w.Append(rec[:0], iov)
						if _, err := o.Open(dst, rec); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
