// Package testnet holds network helpers shared by the tests of several
// packages (relay, gateway, mx, tcpinfo): listeners, echo, checksummed
// streams, network namespaces (netns.go, root only) and an MX link over
// loopback UDP shared by processes (udplink.go). It is imported by tests
// only.
package testnet

import (
	"io"
	"net"
	"net/netip"
	"runtime"
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

// Echo serves on addr, echoing every connection back to its sender.
func Echo(t testing.TB, addr netip.Addr) netip.AddrPort {
	return Serve(t, addr, func(c *net.TCPConn) { io.Copy(c, c); c.Close() })
}

// RoundTripAllocs makes n 1-byte round trips on c (after 200 unmeasured
// ones) and returns the heap allocations per round trip, counted over the
// whole process: the relays under test, if they run in it, and the
// runtime's own.
func RoundTripAllocs(t testing.TB, c *net.TCPConn, n int) float64 {
	t.Helper()
	c.SetNoDelay(true)
	b := []byte{1}
	rt := func() {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		rt()
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range n {
		rt()
	}
	runtime.ReadMemStats(&m1)
	return float64(m1.Mallocs-m0.Mallocs) / float64(n)
}
