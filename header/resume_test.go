package header

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"testing"
)

// TestResumeRecordBytes pins the records' bytes: they are the ones the node
// daemon wrote before the codec moved here, so daemons of both builds
// resume each other's connections.
func TestResumeRecordBytes(t *testing.T) {
	for _, c := range []struct {
		got  []byte
		want string
	}{
		{AppendResumeHello(nil, ResumeKnown, 0x0102030405060708, 0x1112131415161718), "010101020304050607081112131415161718"},
		{AppendResumeHello(nil, 0, 5, 3), "010000000000000000050000000000000003"},
		{AppendResumeData(nil, []byte("abc")), "0200000003616263"},
		{append(AppendResumeDataPrefix(nil, 3), "abc"...), "0200000003616263"},
		{AppendResumeAck(nil, 0x0a0b0c0d0e0f1011), "030a0b0c0d0e0f1011"},
		{AppendResume(nil, ResumeRecord{Type: ResumeFin}), "04"},
		{AppendResume(nil, ResumeRecord{Type: ResumeReset}), "05"},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("encoded %s, want %s", got, c.want)
		}
	}
	if n := len(AppendResumeHello(nil, 0, 0, 0)); n != ResumeHelloSize {
		t.Errorf("HELLO of %d bytes, ResumeHelloSize %d", n, ResumeHelloSize)
	}
}

func TestResumeRecordRefusals(t *testing.T) {
	for _, c := range []struct {
		in   string
		kind error
		text string
	}{
		{"010000000000000000010000000000000002", ErrPayload, "resume HELLO acknowledges 2 of 1 offsets received"},
		{"0200000000", ErrPayload, "resume DATA of 0 bytes"},
		{"0200010001", ErrPayload, "resume DATA of 65537 bytes"},
		{"09", ErrType, "resume record of type 9"},
		{"0200000009616263", ErrShort, ""},
		{"03000000", ErrShort, ""},
		{"", ErrShort, ""},
	} {
		in, _ := hex.DecodeString(c.in)
		_, _, err := ParseResumeRecord(in)
		if !errors.Is(err, c.kind) || c.text != "" && err.Error() != c.text {
			t.Errorf("ParseResumeRecord(%s): %v, want %v %q", c.in, err, c.kind, c.text)
		}
	}
	big := AppendResumeData(nil, make([]byte, MaxResumeData))
	if rec, n, err := ParseResumeRecord(big); err != nil || n != len(big) || len(rec.Data) != MaxResumeData {
		t.Errorf("DATA of MaxResumeData bytes: %d bytes of %d parsed, %v", n, len(big), err)
	}
}

// TestReadResumeOrder: a stream starts with HELLO or RESET, and HELLO
// comes only first; a record of the wrong place is refused from its type
// byte, before its body (none follows here).
func TestReadResumeOrder(t *testing.T) {
	for _, c := range []struct {
		first bool
		in    []byte
		want  ResumeType
		err   error
		text  string
	}{
		{true, AppendResumeHello(nil, 0, 0, 0), ResumeHello, nil, ""},
		{true, []byte{5}, ResumeReset, nil, ""},
		{true, []byte{2}, 0, ErrUnexpected, "resume record 2 where HELLO belongs"},
		{true, []byte{3}, 0, ErrUnexpected, "resume record 3 where HELLO belongs"},
		{false, []byte{1}, 0, ErrUnexpected, "resume record of type 1"},
		{false, []byte{0}, 0, ErrType, "resume record of type 0"},
		{false, []byte{4}, ResumeFin, nil, ""},
		{false, AppendResumeAck(nil, 7), ResumeAck, nil, ""},
		{false, AppendResumeData(nil, []byte("x")), ResumeData, nil, ""},
	} {
		var rec ResumeRecord
		var err error
		if c.first {
			rec, err = ReadResumeHello(bytes.NewReader(c.in))
		} else {
			rec, err = ReadResumeRecord(bufio.NewReader(bytes.NewReader(c.in)))
		}
		if c.err != nil {
			if !errors.Is(err, c.err) || err.Error() != c.text {
				t.Errorf("% x: %v, want %v %q", c.in, err, c.err, c.text)
			}
			continue
		}
		if err != nil || rec.Type != c.want {
			t.Errorf("% x: %v %v, want %v", c.in, rec.Type, err, c.want)
		}
	}
	// A record cut short is the stream's error, as io.ReadFull gives it.
	if _, err := ReadResumeRecord(bufio.NewReader(bytes.NewReader([]byte{3, 0, 0}))); err != io.ErrUnexpectedEOF {
		t.Errorf("cut ACK: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ReadResumeRecord(bufio.NewReader(bytes.NewReader(nil))); err != io.EOF {
		t.Errorf("empty stream: %v, want io.EOF", err)
	}
}

// FuzzResumeRecords: the records of a resumable stream, as a node daemon
// reads them from the far site's. Whatever parses re-encodes to the same
// bytes; every refusal is ErrShort, ErrType or ErrPayload; and the
// stream readers (ReadResumeHello, then ReadResumeRecord) read the records
// the parser finds, in the order a stream may carry them, and refuse the
// same ones. (node's FuzzResumeDaemon plays these bytes to a daemon.)
func FuzzResumeRecords(f *testing.F) {
	resumeKind := func(err error) error {
		for _, k := range []error{ErrShort, ErrType, ErrPayload} {
			if errors.Is(err, k) {
				return k
			}
		}
		return err
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	hello := AppendResumeHello(nil, 0, 0, 0)
	f.Add(hello)
	f.Add(cat(hello, AppendResumeData(nil, []byte("hello, rank")), AppendResumeAck(nil, 3), []byte{4}))
	// The largest DATA declared, cut short: a whole one would make every
	// new input the fuzzer minimizes 64 KiB long.
	f.Add(cat(AppendResumeHello(nil, ResumeKnown, 9, 4), []byte{2, 0, 1, 0, 0, 7}))
	f.Add(cat(hello, []byte{2, 0, 1, 0, 1}))
	f.Add(cat(hello, hello))
	f.Add([]byte{5})
	f.Add(hello[:7])
	f.Fuzz(func(t *testing.T, in []byte) {
		var parsed []ResumeRecord
		var perr error
		for b := in; ; {
			rec, n, err := ParseResumeRecord(b)
			if err != nil {
				if resumeKind(err) == err {
					t.Fatalf("ParseResumeRecord(% .40x): %v is none of ErrShort, ErrType, ErrPayload", b, err)
				}
				perr = err
				break
			}
			if re := AppendResume(nil, rec); !bytes.Equal(re, b[:n]) {
				t.Fatalf("% .40x parses to %+v, which encodes to % .40x", b[:n], rec, re)
			}
			parsed = append(parsed, rec)
			b = b[n:]
		}

		r := bufio.NewReader(bytes.NewReader(in))
		for i := 0; ; i++ {
			var rec ResumeRecord
			var err error
			if i == 0 {
				rec, err = ReadResumeHello(r)
			} else {
				rec, err = ReadResumeRecord(r)
			}
			if i == len(parsed) {
				// The parser stopped here: the reader stops too.
				switch {
				case errors.Is(perr, ErrShort):
					if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrUnexpected) {
						t.Fatalf("record %d cut short: reader says %v", i, err)
					}
				case !errors.Is(err, resumeKind(perr)) && !errors.Is(err, ErrUnexpected):
					t.Fatalf("record %d: parser %v, reader %v", i, perr, err)
				}
				return
			}
			p := parsed[i]
			wrongPlace := (i == 0) != (p.Type == ResumeHello) && p.Type != ResumeReset
			if wrongPlace {
				if !errors.Is(err, ErrUnexpected) && !errors.Is(err, ErrType) {
					t.Fatalf("record %d, %v, out of place: reader says %v", i, p.Type, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("record %d: parser %+v, reader %v", i, p, err)
			}
			if rec.Type != p.Type || rec.Flags != p.Flags || rec.Received != p.Received || rec.Acked != p.Acked || !bytes.Equal(rec.Data, p.Data) {
				t.Fatalf("record %d: parser %+v, reader %+v", i, p, rec)
			}
		}
	})
}

// BenchmarkReadResumeRecord reads ACK and FIN records, which allocate
// nothing, from a buffered stream, as a node daemon's stream reader does.
func BenchmarkReadResumeRecord(b *testing.B) {
	var in []byte
	for i := range 1000 {
		in = AppendResumeAck(in, uint64(i))
	}
	in = append(in, byte(ResumeFin))
	src := bytes.NewReader(in)
	r := bufio.NewReader(src)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadResumeRecord(r); err != nil {
			src.Reset(in)
			r.Reset(src)
		}
	}
}
