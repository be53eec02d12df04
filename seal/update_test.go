package seal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

func secrets(t testing.TB) []byte {
	km := make([]byte, SecretsLen)
	copy(km, material(t))
	return km
}

// updatingPair is the dialer's sealer and the acceptor's opener of one
// direction under mpi5k/3, the sealer bound by lim.
func updatingPair(t testing.TB, s Suite, m Mode, lim Limits) (*Sealer, *Opener) {
	km := secrets(t)
	w, _, err := UpdatingKeys(s, m, km, true, lim)
	if err != nil {
		t.Fatal(err)
	}
	_, r, err := UpdatingKeys(s, m, km, false, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return w, r
}

func phaseOf(rec []byte) bool { return binary.BigEndian.Uint32(rec)&phaseBit != 0 }

// records splits a stream of records into them.
func records(t testing.TB, wire []byte) [][]byte {
	var out [][]byte
	for len(wire) > 0 {
		n, err := recordLen(wire, true)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, wire[:n])
		wire = wire[n:]
	}
	return out
}

// TestKeyUpdate: a sealer bound to 3 records per key flips the phase bit
// every 3 records, one bound to bytes after the bytes of its key, and a
// Reader reads every batch back through all the updates, following them
// one for one, in both suites and modes.
func TestKeyUpdate(t *testing.T) {
	for _, s := range suites {
		for _, m := range modes {
			t.Run(fmt.Sprintf("%v/%v", s, m), func(t *testing.T) {
				w, o := updatingPair(t, s, m, Limits{Records: 3})
				var wire, want []byte
				for i := range 20 {
					b := bytes.Repeat([]byte{byte(i)}, 10+i)
					wire, _ = w.Append(wire, [][]byte{b})
					want = append(want, b...)
				}
				for i, rec := range records(t, wire) {
					if got, exp := phaseOf(rec), (i/3)%2 == 1; got != exp {
						t.Fatalf("record %d: phase bit %v, want %v", i, got, exp)
					}
				}
				if w.Updates() != 6 {
					t.Fatalf("%d updates sealing 20 records 3 per key, want 6", w.Updates())
				}
				got, err := readAll(NewReader(o), &stream{b: wire, step: 5}, 7)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("read %d of %d bytes: %v", len(got), len(want), err)
				}
				if o.Updates() != 6 {
					t.Fatalf("the opener followed %d updates, want 6", o.Updates())
				}

				// By bytes: a batch over MaxRecord is split, and each
				// key seals no more than its bytes.
				w, o = updatingPair(t, s, m, Limits{Bytes: MaxRecord + 100})
				big := make([]byte, 5*MaxRecord+7)
				for i := range big {
					big[i] = byte(i * 7)
				}
				wire, _ = w.Append(nil, [][]byte{big[:100], big[100:]})
				var phases []bool
				for _, rec := range records(t, wire) {
					phases = append(phases, phaseOf(rec))
				}
				// The 7-byte tail fits in the last full record's key.
				if w.Updates() != 4 || fmt.Sprint(phases) != "[false true false true false false]" {
					t.Fatalf("%d updates, phases %v: want one key per full record", w.Updates(), phases)
				}
				got, err = readAll(NewReader(o), &stream{b: wire}, 64<<10)
				if err != nil || !bytes.Equal(got, big) {
					t.Fatalf("read %d of %d bytes: %v", len(got), len(big), err)
				}
			})
		}
	}
}

// TestKeyUpdateAge: a key in use for longer than Age gives way at the
// next record that reads the clock (every ageEvery-th), whatever it has
// sealed.
func TestKeyUpdateAge(t *testing.T) {
	w, o := updatingPair(t, AES256GCM, ModeEncrypt, Limits{Age: time.Minute})
	var wire, want []byte
	seal := func(i int) []byte {
		b := fmt.Appendf(nil, "record %d;", i)
		rec, _ := w.Append(nil, [][]byte{b})
		wire, want = append(wire, rec...), append(want, b...)
		return rec
	}
	seal(0)
	w.h.since = w.h.since.Add(-2 * time.Minute)
	for i := 1; i < ageEvery; i++ {
		if rec := seal(i); phaseOf(rec) {
			t.Fatalf("record %d read the clock", i)
		}
	}
	if rec := seal(ageEvery); !phaseOf(rec) || w.Updates() != 1 {
		t.Fatalf("record %d of a key two minutes old: phase %v, %d updates; want the next key", ageEvery, phaseOf(rec), w.Updates())
	}
	for i := ageEvery + 1; i < 3*ageEvery; i++ {
		if rec := seal(i); !phaseOf(rec) {
			t.Fatalf("record %d: a key a moment old replaced", i)
		}
	}
	got, err := readAll(NewReader(o), &stream{b: wire}, 100)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%q %v", got, err)
	}
}

// TestKeyUpdateNoWayBack: once the opener has moved to the next key, a
// record of the key before (its phase bit is the phase after next) fails,
// replayed or not, as does a record of the current key repeated; a
// record of the key after next, skipping one, fails too.
func TestKeyUpdateNoWayBack(t *testing.T) {
	w, o := updatingPair(t, AES256GCM, ModeEncrypt, Limits{Records: 2})
	var recs [][]byte
	for i := range 7 {
		r, _ := w.Append(nil, [][]byte{fmt.Appendf(nil, "record %d", i)})
		recs = append(recs, r)
	}
	// Phases: 0 0 1 1 0 0 1.
	open := func(o *Opener, i int) error {
		_, err := o.Open(nil, bytes.Clone(recs[i]))
		return err
	}
	fresh := *o
	for i := range 3 {
		if err := open(o, i); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	for _, old := range []int{0, 1, 2} {
		o2 := *o
		if err := open(&o2, old); !errors.Is(err, ErrAuth) {
			t.Fatalf("record %d again after the update: %v, want ErrAuth", old, err)
		}
	}
	// Record 4 is the next key's first: with record 3, the last of the
	// current key, dropped, it fails (sequence numbers go on across keys).
	o2 := *o
	if err := open(&o2, 4); !errors.Is(err, ErrAuth) {
		t.Fatalf("record 4 with record 3 missing: %v", err)
	}
	// A key skipped: from phase 0 straight to record 6 (phase 1, two
	// keys on) fails, as the opener only ever tries the next key.
	o3 := fresh
	if err := open(&o3, 0); err != nil {
		t.Fatal(err)
	}
	if err := open(&o3, 6); !errors.Is(err, ErrAuth) {
		t.Fatalf("a record two keys on: %v", err)
	}
	if err := open(o, 3); err != nil {
		t.Fatalf("record 3: %v", err)
	}
	if o.h.updates != 1 {
		t.Fatalf("%d updates followed, want 1", o.h.updates)
	}
}

// TestKeyUpdateForgedPhase: the phase bit is authenticated. Set on a
// record of the current key, the opener takes it for the next key's
// first and it fails; cleared on a next key's first record, the current
// key fails it; a key update never survives a failed record.
func TestKeyUpdateForgedPhase(t *testing.T) {
	for _, m := range modes {
		w, o := updatingPair(t, AES256GCM, m, Limits{Records: 1})
		r0, _ := w.Append(nil, [][]byte{[]byte("zero")})
		r1, _ := w.Append(nil, [][]byte{[]byte("one")})
		bad := bytes.Clone(r0)
		bad[0] ^= 0x80
		o2 := *o
		if _, err := o2.Open(nil, bad); !errors.Is(err, ErrAuth) {
			t.Fatalf("%v: record 0 with a forged phase bit: %v", m, err)
		}
		if o2.h.updates != 0 || o2.h.phase != 0 {
			t.Fatalf("%v: a failed record moved the opener to phase %x", m, o2.h.phase)
		}
		if _, err := o.Open(nil, bytes.Clone(r0)); err != nil {
			t.Fatal(err)
		}
		bad = bytes.Clone(r1)
		bad[0] ^= 0x80
		if _, err := o.Open(nil, bad); !errors.Is(err, ErrAuth) {
			t.Fatalf("%v: record 1 with its phase bit cleared: %v", m, err)
		}
	}
	// mpi5k/2 has no phase bit: a record carrying one fails before its
	// body is read, as any length out of range.
	_, o := pair(t, AES256GCM, ModeEncrypt)
	uw, _ := updatingPair(t, AES256GCM, ModeEncrypt, Limits{Records: 1})
	uw.Append(nil, [][]byte{[]byte("zero")})
	r1, _ := uw.Append(nil, [][]byte{[]byte("one")})
	if _, err := NewReader(o).Read(make([]byte, 10), (&stream{b: r1}).read); !errors.Is(err, ErrRecordSize) {
		t.Fatalf("an mpi5k/2 reader given a phase bit: %v, want ErrRecordSize", err)
	}
	if _, err := o.Open(nil, r1); !errors.Is(err, ErrAuth) {
		t.Fatalf("an mpi5k/2 opener given a phase bit: %v, want ErrAuth", err)
	}
}

// TestKeyUpdateKeys: every phase has its own key and IV, each derived
// from the one before; the two directions' keys differ and update
// independently (one sealer updates many times while the other does
// not); the key left behind is erased; a record of any phase of one
// connection fails on another (a resumed link's new handshake).
func TestKeyUpdateKeys(t *testing.T) {
	km := secrets(t)
	dw, dr, _ := UpdatingKeys(AES256GCM, ModeEncrypt, km, true, Limits{Records: 1})
	aw, ar, _ := UpdatingKeys(AES256GCM, ModeEncrypt, km, false, Limits{})
	if dw.h.secret == aw.h.secret || dw.h.iv == aw.h.iv {
		t.Fatal("the two directions share a secret or IV")
	}
	seen := map[[keyLen]byte]bool{aw.h.secret: true}
	ivs := map[[ivLen]byte]bool{aw.h.iv: true}
	same := [][]byte{[]byte("the same batch")}
	sealed := map[string]bool{}
	var wire []byte
	for i := range 10 {
		before := len(wire)
		wire, _ = dw.Append(wire, same)
		if seen[dw.h.secret] || ivs[dw.h.iv] {
			t.Fatalf("phase %d repeats a secret or IV", i)
		}
		seen[dw.h.secret], ivs[dw.h.iv] = true, true
		if sealed[string(wire[before+PrefixSize:])] {
			t.Fatalf("record %d seals to the bytes of an earlier one", i)
		}
		sealed[string(wire[before+PrefixSize:])] = true
	}
	if dw.Updates() != 9 || aw.Updates() != 0 {
		t.Fatalf("updates %d and %d", dw.Updates(), aw.Updates())
	}
	// The acceptor's direction, never updated, still works in both ends.
	back, _ := aw.Append(nil, [][]byte{[]byte("back")})
	if p, err := dr.Open(nil, back); err != nil || string(p) != "back" {
		t.Fatalf("the other direction: %q %v", p, err)
	}
	got, err := readAll(NewReader(ar), &stream{b: wire}, 100)
	if err != nil || !bytes.Equal(got, bytes.Repeat(same[0], 10)) {
		t.Fatalf("%q %v", got, err)
	}
	// Erased: the sealer's copy of a key it left has no secret any more.
	h := dw.h
	next, _ := h.successor()
	h.erase()
	if h.secret != [keyLen]byte{} || h.iv != [ivLen]byte{} || h.aead != nil {
		t.Fatal("an erased key keeps its secret, IV or AEAD")
	}
	next.erase()

	// Another connection's keys open none of these records, whatever
	// phase its opener is in.
	_, other, _ := UpdatingKeys(AES256GCM, ModeEncrypt, secrets(t), false, Limits{})
	for i, rec := range records(t, wire) {
		o2 := *other
		if _, err := o2.Open(nil, bytes.Clone(rec)); !errors.Is(err, ErrAuth) {
			t.Fatalf("record %d of one connection opened on another: %v", i, err)
		}
	}
}

// TestLimits: zero limits are the defaults, and no limit goes past them.
func TestLimits(t *testing.T) {
	if got := (Limits{}).orDefault(); got != DefaultLimits {
		t.Fatalf("zero limits: %+v", got)
	}
	over := Limits{Records: 1 << 40, Bytes: 1 << 50, Age: 24 * time.Hour}
	if got := over.orDefault(); got != DefaultLimits {
		t.Fatalf("limits past the defaults: %+v", got)
	}
	small := Limits{Records: 5, Bytes: 6, Age: time.Second}
	if got := small.orDefault(); got != small {
		t.Fatalf("small limits: %+v", got)
	}
	if _, _, err := UpdatingKeys(AES256GCM, ModeEncrypt, make([]byte, MaterialLen), true, Limits{}); err == nil {
		t.Fatal("88 bytes of material taken as secrets")
	}
}

// TestTamperUpdate: flipping any one bit of a key's first record (phase
// bit, length, batch or tag) after a record of the key before makes it
// fail, in both suites and modes; nothing of it is returned.
func TestTamperUpdate(t *testing.T) {
	for _, s := range suites {
		for _, m := range modes {
			w, o := updatingPair(t, s, m, Limits{Records: 1})
			r0, _ := w.Append(nil, [][]byte{[]byte("before")})
			r1, _ := w.Append(nil, [][]byte{bytes.Repeat([]byte("x"), 300)})
			for bit := 0; bit < 8*len(r1); bit += 3 {
				bad := bytes.Clone(r1)
				bad[bit/8] ^= 1 << (7 - bit%8)
				o2 := *o
				r := NewReader(&o2)
				got, err := readAll(r, &stream{b: append(bytes.Clone(r0), bad...)}, 1000)
				if string(got) != "before" || !IsRecordError(err) && err != io.ErrUnexpectedEOF {
					t.Fatalf("%v %v bit %d: read %q, err %v", s, m, bit, got, err)
				}
				if o2.h.updates != 0 {
					t.Fatalf("%v %v bit %d: a failed record moved the key on", s, m, bit)
				}
			}
		}
	}
}

// BenchmarkUpdateCheck: what a record costs its sealer in mpi5k/3 when
// no update is due (counting it against the limits, the clock read for
// Age), apart from the AEAD; BenchmarkRecord has it with the AEAD.
func BenchmarkUpdateCheck(b *testing.B) {
	w, _ := updatingPair(b, AES256GCM, ModeEncrypt, Limits{})
	b.ReportAllocs()
	for b.Loop() {
		if w.h.recs >= 1<<23 {
			w.h.recs, w.h.bytes = 1, 0 // stay clear of the update
		}
		w.update(64)
	}
}
