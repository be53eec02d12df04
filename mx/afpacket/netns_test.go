//go:build linux

package afpacket

import (
	"os"
	"testing"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// veth is a veth pair between two network namespaces this test creates:
// mxt-<pid>-a holds mxa (10.77.0.1, 02:00:00:77:00:01), mxt-<pid>-b holds
// mxb (10.77.0.2, 02:00:00:77:00:02). Root only; removed by Cleanup
// (testnet.Netns).
type veth struct {
	nsA, nsB string
	ipA, ipB string
}

func newVeth(t testing.TB) *veth {
	t.Helper()
	ns := testnet.Netns(t, "mxt", "a", "b")
	v := &veth{nsA: ns[0], nsB: ns[1], ipA: "10.77.0.1", ipB: "10.77.0.2"}
	mtu := "1500"
	if m := os.Getenv("MXT_MTU"); m != "" { // jumbo frames: MXT_MTU=9000
		mtu = m
	}
	testnet.Run(t, "ip", "-n", v.nsA, "link", "add", "mxa", "mtu", mtu, "address", "02:00:00:77:00:01", "type", "veth",
		"peer", "name", "mxb", "mtu", mtu, "address", "02:00:00:77:00:02", "netns", v.nsB)
	// A second pair for a second engine per host (one engine owns an
	// interface's MX frames).
	testnet.Run(t, "ip", "-n", v.nsA, "link", "add", "mxc", "mtu", mtu, "address", "02:00:00:77:00:03", "type", "veth",
		"peer", "name", "mxd", "mtu", mtu, "address", "02:00:00:77:00:04", "netns", v.nsB)
	for _, s := range []struct{ ns, dev, ip string }{{v.nsA, "mxa", v.ipA}, {v.nsB, "mxb", v.ipB},
		{v.nsA, "mxc", "10.77.1.1"}, {v.nsB, "mxd", "10.77.1.2"}} {
		testnet.Run(t, "ip", "-n", s.ns, "addr", "add", s.ip+"/24", "dev", s.dev)
		testnet.Run(t, "ip", "-n", s.ns, "link", "set", s.dev, "up")
	}
	return v
}
