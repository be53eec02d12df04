package relay

import (
	"crypto/tls"
	"net"
	"testing"
)

// TestTCPOf: the socket is found under a *tls.Conn and a wrapper of it,
// and a pipe has none.
func TestTCPOf(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{})
	type wrapped struct{ *tls.Conn }
	for _, x := range []net.Conn{c, tc, wrapped{tc}} {
		if TCPOf(x) != c.(*net.TCPConn) {
			t.Errorf("TCPOf(%T) did not find the socket", x)
		}
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if TCPOf(p) != nil || sockOf(p) != nil {
		t.Error("TCPOf(pipe) is not nil")
	}
}
