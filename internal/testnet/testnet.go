// Package testnet holds network helpers shared by the tests of several
// packages (relay, gateway). It is imported by tests only.
package testnet

import (
	"net"
	"net/netip"
	"testing"
)

// Serve listens on addr (any port) until the test ends and runs f, in its
// own goroutine, on every accepted connection. It returns the address.
func Serve(t testing.TB, addr netip.Addr, f func(c *net.TCPConn)) netip.AddrPort {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: addr.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go f(c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}
