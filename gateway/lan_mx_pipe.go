package gateway

import (
	"context"

	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/relay"
)

// LAN forwarding modes (--lan-forward), for LAN connections that are not
// kernel sockets (--lan-transport mx):
//
//   - chunked: a chunk at a time. The relay reads a chunk from the MX
//     stream (a copy out of the stream's receive queue) and writes it on
//     the WAN link itself before it reads the next; toward the node it
//     writes a payload with Stream.Write, which copies it into the
//     stream's own chunks and returns at once.
//   - pipelined: two-buffer forwarding, as Madeleine's gateways do. The
//     stream keeps two receives posted, so the node's next message is
//     pulled into one buffer while the relay copies the last out of the
//     other, and the relay hands a bulk chunk to the link's writer and
//     reads the next meanwhile; toward the node, each received payload is sent from the
//     relay's buffer itself (mx.Stream.WriteNoCopy) while the next is
//     received, at most two started, a buffer recycled (and its WAN credit
//     returned) once the node's engine has pulled it.
//
// Chunked is the default: on the measured LAN (2026-11-27) pipelined was
// within the spread node to WAN and about a tenth slower toward the node,
// where a buffer is free only once the node has pulled it, a LAN round
// trip later. Figures: bench/figures/mx.
const (
	LANForwardChunked   = "chunked"
	LANForwardPipelined = "pipelined"
)

var lanForwardModes = []string{LANForwardChunked, LANForwardPipelined}

// pipeConn is an MX LAN connection in pipelined mode: a relay.PipelinedConn.
type pipeConn struct {
	*mxLANConn
	// The requests of the started writes, oldest first: each write's
	// slice is reused, so a write allocates nothing here.
	started [2][]*mx.Request
	head, n int
	// ctx ends with Abort or Close: a started write whose peer is gone
	// never completes, and FinishWrite must not wait for it.
	ctx    context.Context
	cancel context.CancelFunc
}

func newPipeConn(c *mxLANConn) *pipeConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &pipeConn{mxLANConn: c, ctx: ctx, cancel: cancel}
}

func (c *pipeConn) StartWrite(p []byte) error {
	if c.n == len(c.started) {
		if err := c.FinishWrite(); err != nil {
			return err
		}
	}
	i := (c.head + c.n) % len(c.started)
	reqs, err := c.Stream.WriteNoCopy(p, c.started[i][:0])
	c.started[i] = reqs
	c.n++ // even on error: FinishWrite waits for what did start
	return err
}

func (c *pipeConn) FinishWrite() error {
	if c.n == 0 {
		return nil
	}
	reqs := c.started[c.head]
	var err error
	for _, r := range reqs {
		if _, e := r.Wait(c.ctx); e != nil && err == nil {
			err = e
		}
	}
	clear(reqs)
	c.started[c.head] = reqs[:0]
	c.head = (c.head + 1) % len(c.started)
	c.n--
	return err
}

func (c *pipeConn) Abort() error {
	c.cancel()
	return c.mxLANConn.Abort()
}

func (c *pipeConn) Close() error {
	err := c.mxLANConn.Close()
	c.cancel()
	return err
}

// streamConfig is the configuration of the transport's streams: in
// pipelined mode each keeps two receives posted, so the node's next
// message is pulled into one buffer while the relay takes the last.
func (t *MXTransport) streamConfig() mx.StreamConfig {
	c := t.Stream
	if t.Forward == LANForwardPipelined && c.RecvAhead == 0 {
		c.RecvAhead = 2
	}
	return c
}

// lanConn is what the transport hands the gateway for stream c.
func (t *MXTransport) lanConn(c *mxLANConn) LANConn {
	if t.Forward == LANForwardPipelined {
		return newPipeConn(c)
	}
	return c
}

var _ relay.PipelinedConn = (*pipeConn)(nil)
