package header

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

// DefaultReaderBuffer is the Reader's buffer size when NewReader gets 0. It
// holds many small frames, so a burst of control frames and small DATA costs
// one read system call, while large payloads bypass it.
const DefaultReaderBuffer = 64 << 10

// Reader reads frames from a byte stream (a WAN link or a LAN connection).
// Headers and small payloads come through an internal buffer; the part of a
// payload not yet buffered is read straight into the caller's buffer, so
// bulk DATA lands in its stream's buffer without an extra copy.
//
// A Reader is not safe for concurrent use. It never reads a payload larger
// than its limit: an oversized length fails in Next before any of it is read.
type Reader struct {
	r        io.Reader
	buf      []byte  // nil until a read needs it, and after Release
	bp       *[]byte // buf's pool entry (a buffer of DefaultReaderBuffer bytes)
	size     int
	off, end int    // buffered bytes are buf[off:end]
	pending  uint32 // payload bytes of the current frame not yet consumed
	max      uint32
	hdr      Header
}

// NewReader returns a Reader on r with a buffer of size bytes (at least
// Size; 0 means DefaultReaderBuffer) and a payload limit of MaxPayload.
func NewReader(r io.Reader, size int) *Reader {
	if size == 0 {
		size = DefaultReaderBuffer
	}
	if size < Size {
		size = Size
	}
	return &Reader{r: r, size: size, max: MaxPayload}
}

// readerBufs holds the buffers of Readers that have nothing buffered
// (Release): a WAN link idles most of the time, and a gateway with hundreds
// of links would otherwise keep a 64 KiB buffer per link.
var readerBufs = sync.Pool{New: func() any {
	b := make([]byte, DefaultReaderBuffer)
	return &b
}}

// ensure gives the Reader its buffer before a read.
func (r *Reader) ensure() {
	if r.buf != nil {
		return
	}
	if r.size == DefaultReaderBuffer {
		r.bp = readerBufs.Get().(*[]byte)
		r.buf = *r.bp
		return
	}
	r.buf = make([]byte, r.size)
}

// Release gives up the buffer while nothing is buffered, so an idle
// Reader holds none; the next read takes one again. It does nothing when
// bytes are buffered or a frame's payload is still to be read.
func (r *Reader) Release() {
	if r.buf == nil || r.end != r.off || r.pending > 0 {
		return
	}
	if r.bp != nil {
		readerBufs.Put(r.bp)
	}
	r.buf, r.bp, r.off, r.end = nil, nil, 0, 0
}

// SetMaxPayload lowers the largest DATA payload accepted (what this side
// announced in its HELLO). Values outside 1..MaxPayload mean MaxPayload.
func (r *Reader) SetMaxPayload(n uint32) {
	if n == 0 || n > MaxPayload {
		n = MaxPayload
	}
	r.max = n
}

// Buffered reports how many bytes are buffered beyond the current frame's
// unread payload; a relay uses it to decide whether to flush before blocking.
func (r *Reader) Buffered() int {
	n := r.end - r.off - int(r.pending)
	if n < 0 {
		return 0
	}
	return n
}

const maxEmptyReads = 100

// fill reads until at least need bytes are buffered. It compacts the buffer
// first when the tail is too short.
func (r *Reader) fill(need int) error {
	r.ensure()
	if r.off > 0 && len(r.buf)-r.off < need {
		r.end = copy(r.buf, r.buf[r.off:r.end])
		r.off = 0
	}
	empty := 0
	for r.end-r.off < need {
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if r.end-r.off >= need {
			return nil
		}
		if err != nil {
			if err == io.EOF && r.end-r.off > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if n == 0 {
			if empty++; empty >= maxEmptyReads {
				return io.ErrNoProgress
			}
		}
	}
	return nil
}

// Next discards whatever is left of the current frame's payload, then reads
// and validates the next header. io.EOF means the stream ended cleanly
// between frames; io.ErrUnexpectedEOF means it ended inside one.
func (r *Reader) Next() (Header, error) {
	if r.pending > 0 {
		if err := r.Discard(); err != nil {
			return Header{}, err
		}
	}
	if err := r.fill(Size); err != nil {
		return Header{}, err
	}
	h, err := Decode(r.buf[r.off : r.off+Size])
	if err != nil {
		return h, err
	}
	if h.Type == TypeData && h.Length > r.max {
		return h, fmt.Errorf("%w: DATA of %d bytes (announced limit %d)", ErrTooLarge, h.Length, r.max)
	}
	r.off += Size
	r.pending = h.Length
	r.hdr = h
	return h, nil
}

// FrameBuffered reports whether the next frame, header and payload, is in
// the buffer, so reading it cannot block (or whether the next header is
// malformed, which Next reports without reading). An event loop reads
// frames while it is true and leaves a partial frame to a blocking reader.
func (r *Reader) FrameBuffered() bool {
	if r.pending > 0 || r.end-r.off < Size {
		return false
	}
	h, err := Decode(r.buf[r.off : r.off+Size])
	return err != nil || r.end-r.off-Size >= int(h.Length)
}

// Room is how many bytes FillFrom can read now.
func (r *Reader) Room() int {
	if r.pending > 0 {
		return 0
	}
	return r.size - (r.end - r.off)
}

// FillFrom makes one read into the buffer's free space with read, which an
// event loop makes non-blocking, and returns its result; (0, nil) when the
// buffer has no room. It compacts the buffer first.
func (r *Reader) FillFrom(read func([]byte) (int, error)) (int, error) {
	if r.pending > 0 {
		return 0, nil // the payload may go straight to the caller's buffer
	}
	r.ensure()
	if r.off > 0 {
		r.end = copy(r.buf, r.buf[r.off:r.end])
		r.off = 0
	}
	if r.end == len(r.buf) {
		return 0, nil
	}
	n, err := read(r.buf[r.end:])
	r.end += max(n, 0)
	return n, err
}

// Remaining is the number of payload bytes of the current frame not yet read.
func (r *Reader) Remaining() int { return int(r.pending) }

// ReadPayload reads min(len(dst), Remaining()) payload bytes of the current
// frame into dst and returns how many. Call it again (e.g. for the second part
// of a ring buffer) until Remaining is 0.
func (r *Reader) ReadPayload(dst []byte) (int, error) {
	want := min(len(dst), int(r.pending))
	dst = dst[:want]
	got := copy(dst, r.buf[r.off:r.end])
	r.off += got
	if got == want {
		r.pending -= uint32(got)
		return got, nil
	}
	// The rest is not buffered. Read a large remainder straight into dst;
	// refill the buffer for a small one so the following headers arrive in
	// the same system call.
	rest := want - got
	if rest >= r.size/2 {
		n, err := io.ReadFull(r.r, dst[got:])
		got += n
		r.pending -= uint32(got)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return got, err
	}
	r.off, r.end = 0, 0
	if err := r.fill(rest); err != nil {
		r.pending -= uint32(got)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return got, err
	}
	copy(dst[got:], r.buf[:rest])
	r.off = rest
	r.pending -= uint32(want)
	return want, nil
}

// Discard skips the rest of the current frame's payload.
func (r *Reader) Discard() error {
	for r.pending > 0 {
		n := min(int(r.pending), r.end-r.off)
		r.off += n
		r.pending -= uint32(n)
		if r.pending == 0 {
			break
		}
		r.off, r.end = 0, 0
		if err := r.fill(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// ReadFrame reads the next frame whole: its header and its payload into
// buf[:h.Length]. A payload that does not fit buf fails with ErrShort (the
// payload is skipped so the stream stays in sync).
func (r *Reader) ReadFrame(buf []byte) (Header, []byte, error) {
	h, err := r.Next()
	if err != nil {
		return h, nil, err
	}
	if int(h.Length) > len(buf) {
		if err := r.Discard(); err != nil {
			return h, nil, err
		}
		return h, nil, fmt.Errorf("%w: %v payload of %d bytes, buffer %d", ErrShort, h.Type, h.Length, len(buf))
	}
	n, err := r.ReadPayload(buf[:h.Length])
	return h, buf[:n], err
}

// ReadOne reads exactly one frame from r with no read-ahead, for a
// connection on which the first frame is followed by bytes a Reader must
// not have consumed: the application's data after an OPEN, or the link's
// frames after a HELLO. A payload longer than max is refused with
// ErrTooLarge before it is read (Decode's per-type limits apply as well).
func ReadOne(r io.Reader, max int) (Header, []byte, error) {
	return readOne(r, func(h Header) error {
		if int(h.Length) > max {
			return fmt.Errorf("%w: %v of %d bytes (limit %d)", ErrTooLarge, h.Type, h.Length, max)
		}
		return nil
	})
}

// readOne reads one frame's header, lets admit refuse it before any of
// its body is read, then reads the body.
func readOne(r io.Reader, admit func(Header) error) (Header, []byte, error) {
	var hb [Size]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return Header{}, nil, err
	}
	h, err := Decode(hb[:])
	if err != nil {
		return h, nil, err
	}
	if err := admit(h); err != nil {
		return h, nil, err
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		return h, nil, fmt.Errorf("header: %v payload of %d bytes truncated: %w", h.Type, h.Length, err)
	}
	return h, p, nil
}

// ErrUnexpected is the error of a frame whose type is valid but not
// allowed where it arrived (ReadFirst).
var ErrUnexpected = errors.New("header: frame type not allowed here")

// ReadFirst reads the first frame of a connection from a peer not yet
// trusted, as ReadOne does (exactly one frame, no read-ahead), but admits
// only the control frames in allowed: the type and declared length are
// checked from the 12-byte header, and a frame of another type (a PAD or
// DATA declaring a megabyte, say) or longer than MaxControl is refused
// before any of its body is read. The body it allocates is therefore at
// most MaxControl bytes, whatever the peer declares.
func ReadFirst(r io.Reader, allowed ...Type) (Header, []byte, error) {
	return readOne(r, func(h Header) error {
		if !slices.Contains(allowed, h.Type) {
			return fmt.Errorf("%w: first frame is %v declaring %d bytes, want %s (at most %d bytes)",
				ErrUnexpected, h.Type, h.Length, typeList(allowed), MaxControl)
		}
		if h.Length > MaxControl {
			return fmt.Errorf("%w: first frame %v of %d bytes (limit %d)", ErrTooLarge, h.Type, h.Length, MaxControl)
		}
		return nil
	})
}

// typeList names ts as "A, B or C".
func typeList(ts []Type) string {
	var b strings.Builder
	for i, t := range ts {
		switch {
		case i == 0:
		case i == len(ts)-1:
			b.WriteString(" or ")
		default:
			b.WriteString(", ")
		}
		b.WriteString(t.String())
	}
	return b.String()
}
