package relay

import (
	"net"
	"syscall"
)

// TCPOf returns the kernel TCP connection under c: c itself, or the
// connection a wrapper such as *tls.Conn runs over (its NetConn method),
// unwrapped as deep as it goes; nil if there is none (a pipe in tests).
// Readers of TCP_INFO and setters of socket options use it, so a link
// over an encrypting conn keeps its socket tuning and queue control.
func TCPOf(c net.Conn) *net.TCPConn {
	for range 8 { // wrappers do not nest deeper; a cycle must not hang
		switch x := c.(type) {
		case *net.TCPConn:
			return x
		case TCPConn:
			return x.TCPConn
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// sockOf is c's socket: c itself if it has one, else TCPOf's (nil if
// there is none).
func sockOf(c net.Conn) syscall.Conn {
	if sc, ok := c.(syscall.Conn); ok {
		return sc
	}
	if tc := TCPOf(c); tc != nil {
		return tc
	}
	return nil
}
