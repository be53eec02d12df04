package relay

// Payload buffers. A DATA payload's buffer is
//
//  1. taken, getBuf: by the out-stage's read (outbound.go) or the
//     reader's recvData (recv.go);
//  2. held by its frame (frame.buf) until it is on the socket, or by the
//     stream's receive queue until the in-stage has written it;
//  3. given back, putBuf: by Link.sent (send.go), by inStep (inbound.go),
//     or when its stream or link ends first.

import (
	"math/bits"
	"sync"
)

// Payload buffers come from power-of-two size classes (512 B .. 1 MiB) so a
// 40-byte MPI message does not pin a 128 KiB chunk while it waits in a
// stream's receive queue. Pointers to slices are pooled so Put does not
// allocate.
const (
	minClassShift = 9
	maxClassShift = 20
)

var pools [maxClassShift - minClassShift + 1]sync.Pool

func class(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a pooled buffer of at least n bytes (n ≤ 1 MiB), sliced to n.
func getBuf(n int) *[]byte {
	c := class(n)
	if p, _ := pools[c].Get().(*[]byte); p != nil {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	c := class(cap(*p))
	if cap(*p) != 1<<(c+minClassShift) {
		return // not one of ours
	}
	pools[c].Put(p)
}

// putBufs recycles every buffer of bufs and clears its slots, so the slice
// pins none of them.
func putBufs(bufs []*[]byte) {
	for i, p := range bufs {
		putBuf(p)
		bufs[i] = nil
	}
}
