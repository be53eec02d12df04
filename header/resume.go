package header

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Resume records (docs/wire-format.md, "Resumable streams"): what the two
// node daemons of a resumable connection write on its MX stream instead of
// the rank's raw bytes. A record is a type byte and a body whose size the
// type fixes, but for DATA's bytes; there is no frame header, because the
// gateways in between pass the stream's bytes on without reading them.

// ResumeType is the type byte of a resume record.
type ResumeType uint8

// Resume record types.
const (
	ResumeHello ResumeType = 1 // u8 flags, u64 received, u64 acknowledged: each end's first record on every stream
	ResumeData  ResumeType = 2 // u32 length 1..MaxResumeData, then the rank's bytes
	ResumeAck   ResumeType = 3 // u64 acknowledged
	ResumeFin   ResumeType = 4 // the sender's end of data (takes one offset)
	ResumeReset ResumeType = 5 // the connection is over: reset the rank
)

var resumeNames = [...]string{
	ResumeHello: "HELLO", ResumeData: "DATA", ResumeAck: "ACK", ResumeFin: "FIN", ResumeReset: "RESET",
}

func (t ResumeType) String() string {
	if t >= ResumeHello && t <= ResumeReset {
		return resumeNames[t]
	}
	return fmt.Sprintf("resume type(%d)", uint8(t))
}

// resumeFixed is the size of each type's body, DATA's bytes left out.
var resumeFixed = [...]int{ResumeHello: 17, ResumeData: 4, ResumeAck: 8, ResumeFin: 0, ResumeReset: 0}

const (
	// ResumeKnown is HELLO's flag bit 0 (the opener's HELLO): the acceptor
	// answered on an earlier stream, so it must know the resume id.
	ResumeKnown = 1
	// ResumeHelloSize is the size of a HELLO record.
	ResumeHelloSize = 1 + 17
	// ResumeDataPrefix is the size of a DATA record before its bytes.
	ResumeDataPrefix = 1 + 4
	// MaxResumeData is the most bytes one DATA record carries.
	MaxResumeData = 1 << 16
)

// ResumeRecord is one decoded resume record.
type ResumeRecord struct {
	Type     ResumeType
	Flags    uint8  // HELLO
	Received uint64 // HELLO: offsets received
	Acked    uint64 // HELLO, ACK: offsets acknowledged
	Data     []byte // DATA
}

// AppendResumeHello appends a HELLO record: flags, the offsets this end
// received and of those the ones it acknowledged.
func AppendResumeHello(b []byte, flags uint8, received, acked uint64) []byte {
	b = append(b, byte(ResumeHello), flags)
	b = binary.BigEndian.AppendUint64(b, received)
	return binary.BigEndian.AppendUint64(b, acked)
}

// AppendResumeDataPrefix appends the start of a DATA record of n bytes,
// which the caller appends next (1 ≤ n ≤ MaxResumeData).
func AppendResumeDataPrefix(b []byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append(b, byte(ResumeData)), uint32(n))
}

// AppendResumeData appends a DATA record of data.
func AppendResumeData(b, data []byte) []byte {
	return append(AppendResumeDataPrefix(b, len(data)), data...)
}

// AppendResumeAck appends an ACK record of n offsets.
func AppendResumeAck(b []byte, n uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, byte(ResumeAck)), n)
}

// AppendResume appends rec whatever its type.
func AppendResume(b []byte, rec ResumeRecord) []byte {
	switch rec.Type {
	case ResumeHello:
		return AppendResumeHello(b, rec.Flags, rec.Received, rec.Acked)
	case ResumeData:
		return AppendResumeData(b, rec.Data)
	case ResumeAck:
		return AppendResumeAck(b, rec.Acked)
	}
	return append(b, byte(rec.Type))
}

// resumeError is a refused record: its text is the one the node daemon
// logs, and errors.Is finds the sentinel beneath.
type resumeError struct {
	msg  string
	kind error
}

func (e *resumeError) Error() string { return e.msg }
func (e *resumeError) Unwrap() error { return e.kind }

func refuse(kind error, format string, args ...any) error {
	return &resumeError{fmt.Sprintf(format, args...), kind}
}

// parseResumeBody decodes the fixed body b of a record of type t and
// checks it: a HELLO acknowledges no more than it received, a DATA length
// is 1..MaxResumeData (ErrPayload).
func parseResumeBody(t ResumeType, b []byte) (ResumeRecord, error) {
	rec := ResumeRecord{Type: t}
	switch t {
	case ResumeHello:
		rec.Flags = b[0]
		rec.Received, rec.Acked = binary.BigEndian.Uint64(b[1:9]), binary.BigEndian.Uint64(b[9:17])
		if rec.Acked > rec.Received {
			return rec, refuse(ErrPayload, "resume HELLO acknowledges %d of %d offsets received", rec.Acked, rec.Received)
		}
	case ResumeData:
		if n := binary.BigEndian.Uint32(b); n == 0 || n > MaxResumeData {
			return rec, refuse(ErrPayload, "resume DATA of %d bytes", n)
		}
	case ResumeAck:
		rec.Acked = binary.BigEndian.Uint64(b)
	}
	return rec, nil
}

func knownResume(t ResumeType) bool { return t >= ResumeHello && t <= ResumeReset }

// ParseResumeRecord decodes the record at the start of b and returns it
// with its size. A record b holds only part of is ErrShort; a DATA
// record's Data is a slice of b.
func ParseResumeRecord(b []byte) (ResumeRecord, int, error) {
	if len(b) == 0 {
		return ResumeRecord{}, 0, fmt.Errorf("%w: no resume record", ErrShort)
	}
	t := ResumeType(b[0])
	if !knownResume(t) {
		return ResumeRecord{Type: t}, 0, refuse(ErrType, "resume record of type %d", t)
	}
	n := 1 + resumeFixed[t]
	if len(b) < n {
		return ResumeRecord{Type: t}, 0, fmt.Errorf("%w: resume %v of %d bytes (want %d)", ErrShort, t, len(b), n)
	}
	rec, err := parseResumeBody(t, b[1:n])
	if err != nil {
		return rec, 0, err
	}
	if t != ResumeData {
		return rec, n, nil
	}
	k := int(binary.BigEndian.Uint32(b[1:]))
	if len(b) < n+k {
		return rec, 0, fmt.Errorf("%w: resume DATA of %d bytes, %d present", ErrShort, k, len(b)-n)
	}
	rec.Data = b[n : n+k]
	return rec, n + k, nil
}

// ByteReader is what the record readers read from: a bufio.Reader, say.
type ByteReader interface {
	io.Reader
	io.ByteReader
}

// readResume reads the record of type t, whose type byte r gave, letting
// admit refuse it before any of its body is read. Errors of r come back as
// io.ReadFull gives them: io.EOF when r ends before a body, or before a
// record.
func readResume(r ByteReader, t ResumeType, admit func(ResumeType) error) (ResumeRecord, error) {
	if err := admit(t); err != nil {
		return ResumeRecord{Type: t}, err
	}
	var b [17]byte
	body := b[:resumeFixed[t]]
	if err := readFixed(r, body); err != nil {
		return ResumeRecord{Type: t}, err
	}
	rec, err := parseResumeBody(t, body)
	if err != nil || t != ResumeData {
		return rec, err
	}
	rec.Data = make([]byte, binary.BigEndian.Uint32(body))
	_, err = io.ReadFull(r, rec.Data)
	return rec, err
}

// readFixed fills b as io.ReadFull would, a byte at a time, so that b
// stays on its caller's stack: no allocation per record.
func readFixed(r io.ByteReader, b []byte) error {
	for i := range b {
		c, err := r.ReadByte()
		if err != nil {
			if err == io.EOF && i > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		b[i] = c
	}
	return nil
}

// ReadResumeHello reads the first record of a stream, which is HELLO or
// RESET (a refusal): another type is refused (ErrUnexpected) before its
// body is read.
func ReadResumeHello(r ByteReader) (ResumeRecord, error) {
	c, err := r.ReadByte()
	if err != nil {
		return ResumeRecord{}, err
	}
	return readResume(r, ResumeType(c), func(t ResumeType) error {
		if t != ResumeHello && t != ResumeReset {
			return refuse(ErrUnexpected, "resume record %d where HELLO belongs", t)
		}
		return nil
	})
}

// ReadResumeRecord reads one of the records that follow a stream's
// HELLO: DATA, ACK, FIN or RESET. DATA's bytes are in a buffer of their
// own. Another type is refused (ErrType, or ErrUnexpected for a second
// HELLO) before its body is read.
func ReadResumeRecord(r ByteReader) (ResumeRecord, error) {
	c, err := r.ReadByte()
	if err != nil {
		return ResumeRecord{}, err
	}
	return readResume(r, ResumeType(c), func(t ResumeType) error {
		switch {
		case t == ResumeHello:
			return refuse(ErrUnexpected, "resume record of type %d", t)
		case !knownResume(t):
			return refuse(ErrType, "resume record of type %d", t)
		}
		return nil
	})
}
