package seal

import (
	"errors"
	"io"
)

// readRoom is the free space a Reader keeps for a read beyond the
// largest record, so a read takes the next record's start along.
const readRoom = 64 << 10

// minRead: a Reader moves a partial record to the front of its buffer
// rather than read fewer bytes than this into the tail.
const minRead = 16 << 10

// Reader turns a byte stream of records into the batches they carry.
// The bytes come from the read function each Read is given, so one
// Reader serves both a blocking read and the poller thread's
// non-blocking one. Not safe for concurrent use.
type Reader struct {
	o        *Opener
	buf      []byte
	off, end int    // received and not yet opened: buf[off:end]
	plain    []byte // opened and not yet read (in buf)
	err      error  // a failed record: the stream is dead
}

// NewReader reads the records o opens.
func NewReader(o *Opener) *Reader {
	return &Reader{o: o}
}

// Buffered reports whether bytes are held that Read returns or opens
// without reading more: opened batch bytes, or a whole record.
func (r *Reader) Buffered() bool {
	if len(r.plain) > 0 {
		return true
	}
	if r.end-r.off < PrefixSize {
		return false
	}
	n, err := recordLen(r.buf[r.off:r.end], r.o.h.updating)
	return err != nil || r.end-r.off >= n
}

// Read fills p with batch bytes. When none are held it reads with read
// until a whole record has arrived and opens it: straight into p when it
// fits there, else in the Reader's buffer. read's errors are returned
// as they are (a non-blocking read's "would block" included); an end of
// stream inside a record is io.ErrUnexpectedEOF. A record that fails
// (ErrAuth, ErrRecordSize) fails every later Read.
func (r *Reader) Read(p []byte, read func([]byte) (int, error)) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	empty := 0
	for {
		if len(r.plain) > 0 {
			n := copy(p, r.plain)
			r.plain = r.plain[n:]
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		need := PrefixSize
		if r.end-r.off >= PrefixSize {
			n, err := recordLen(r.buf[r.off:r.end], r.o.h.updating)
			if err != nil {
				r.err = err
				return 0, err
			}
			if r.end-r.off >= n {
				rec := r.buf[r.off : r.off+n]
				r.off += n
				if r.off == r.end {
					r.off, r.end = 0, 0 // rec stays valid until the next read
				}
				pt, err := r.o.Open(p[:0:len(p)], rec)
				if err != nil {
					r.err = err
					return 0, err
				}
				if len(pt) > 0 && len(p) > 0 && &pt[0] == &p[0] {
					return len(pt), nil
				}
				r.plain = pt
				continue
			}
			need = n
		}
		if r.buf == nil {
			r.buf = make([]byte, MaxRecord+Overhead+readRoom)
		}
		if r.off > 0 && (len(r.buf)-r.off < need || len(r.buf)-r.end < minRead) {
			r.end = copy(r.buf, r.buf[r.off:r.end])
			r.off = 0
		}
		k, err := read(r.buf[r.end:])
		r.end += max(k, 0)
		if err != nil {
			if err == io.EOF && r.end > r.off {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if k <= 0 {
			if empty++; empty >= 100 {
				return 0, io.ErrNoProgress
			}
		}
	}
}

// IsRecordError reports whether err is a record that failed: the
// connection carried bytes that are not the peer's records.
func IsRecordError(err error) bool {
	return errors.Is(err, ErrAuth) || errors.Is(err, ErrRecordSize) || errors.Is(err, ErrAlert)
}
