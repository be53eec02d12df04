package gateway

import (
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestDestinationPolicy: a stream from another site to a port outside
// --wan-allow-ports is refused by the destination's gateway (counted as
// dst_port), and never reaches the service; one to an allowed port works.
func TestDestinationPolicy(t *testing.T) {
	_, a, b := startPair(t, func(c *Config) { c.AllowPorts = PortSet{{32768, 60999}} })
	var svc net.Listener
	var err error
	for p := 20000; p < 20100 && svc == nil; p++ { // a port outside the policy
		svc, err = net.Listen("tcp", netip.AddrPortFrom(nodeB, uint16(p)).String())
	}
	if svc == nil {
		t.Fatal(err)
	}
	defer svc.Close()
	reached := make(chan struct{}, 1)
	go func() {
		if c, err := svc.Accept(); err == nil {
			reached <- struct{}{}
			c.Close()
		}
	}()
	c, err := lanOpen(a.LANAddr(), nodeA, svc.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _ := io.Copy(io.Discard, c)
	c.Close()
	if n != 0 {
		t.Fatalf("read %d bytes from a refused stream", n)
	}
	if got := refusedFor(t, b, "dst_port"); got != 1 {
		t.Fatalf("dst_port refusals %v, want 1", got)
	}
	select {
	case <-reached:
		t.Fatal("the service outside the policy was connected to")
	case <-time.After(100 * time.Millisecond):
	}

	dst := testnet.Serve(t, nodeB, testnet.SumServer) // an ephemeral port: allowed
	if !b.cfg.AllowPorts.Has(dst.Port()) {
		t.Skipf("the kernel gave port %d, outside 32768-60999", dst.Port())
	}
	c, err = lanOpen(a.LANAddr(), nodeA, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := testnet.SendAndCheck(c, mrand.New(mrand.NewPCG(3, 3)), 1<<20); err != nil {
		t.Fatal(err)
	}
}

func TestParsePortSet(t *testing.T) {
	for in, want := range map[string]string{
		"any": "1-65535", "5201": "5201", "32768-60999,5201": "5201,32768-60999", " 7 - 9": "",
		"0": "", "65536": "", "9-7": "", "": "", "1,,2": "",
	} {
		s, err := ParsePortSet(in)
		if want == "" {
			if err == nil {
				t.Errorf("ParsePortSet(%q) = %v, want an error", in, s)
			}
			continue
		}
		if err != nil || s.String() != want {
			t.Errorf("ParsePortSet(%q) = %v, %v; want %s", in, s, err, want)
		}
	}
	if metricsListen(":9105") != "127.0.0.1:9105" || metricsListen("0.0.0.0:9105") != "0.0.0.0:9105" {
		t.Error("metricsListen: a bare port must mean loopback, a host must be kept")
	}
}

// FuzzParsePortSet: what ParsePortSet accepts prints as text it parses
// back to the same set.
func FuzzParsePortSet(f *testing.F) {
	for _, s := range []string{"any", "1024-65535", "5201,32768-60999", "9-7", "65536"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParsePortSet(in)
		if err != nil {
			return
		}
		s2, err := ParsePortSet(s.String())
		if err != nil || s2.String() != s.String() {
			t.Fatalf("%q -> %q -> %v, %v", in, s, s2, err)
		}
	})
}
