package shimtest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Two sites with native IPv6 addresses (unique local, on lo): site a is
// fd5c:a::/64 with its gateway at fd5c:a::fe, site b fd5c:b::/64 at
// fd5c:b::fe.
var v6Addrs = []string{"fd5c:a::1", "fd5c:a::fe", "fd5c:b::1", "fd5c:b::fe"}

const netnsEnv = "MPI5K_SHIMTEST_NETNS"

// TestNativeIPv6 relays connections between two IPv6 sites: blocking and
// non-blocking connects, the destination's accept/accept4/getpeername
// reporting the true IPv6 peer, dup and errno. The addresses live in a
// network namespace of the test's own (this binary re-executed under
// unshare --net), so nothing is added to the machine's interfaces.
func TestNativeIPv6(t *testing.T) {
	if os.Getenv(netnsEnv) == "" {
		if os.Geteuid() != 0 {
			t.Skip("needs root for a private network namespace")
		}
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Fatalf("unshare (util-linux) not found: %v", err)
		}
		cmd := exec.Command("unshare", "--net", os.Args[0], "-test.run=^TestNativeIPv6$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), netnsEnv+"=1", builtEnv+"="+strings.Join([]string{libPath, progPath, goHostPath}, ":"))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestNativeIPv6") {
			t.Fatalf("in its own network namespace: %v\n%s", err, out)
		}
		return
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, a := range v6Addrs {
		addr := &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr(a).AsSlice()), Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			t.Fatalf("address %s on lo: %v", a, err)
		}
	}
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "map.conf")
	text := fmt.Sprintf("site a id=1 lan=[fd5c:a::fe]:%d wan=[fd5c:a::fd]:7001\nnet a fd5c:a::/64\n"+
		"site b id=2 lan=[fd5c:b::fe]:%d wan=[fd5c:b::fd]:7001\nnet b fd5c:b::/64\n",
		freePort(t, "[fd5c:a::fe]"), freePort(t, "[fd5c:b::fe]"))
	if err := os.WriteFile(mapPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := sitemap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, dir: dir, mapPath: mapPath, gw: startFakeGW(t, m)}
	const src, dst = "fd5c:a::1", "fd5c:b::1"

	port, acc := echoServer(t, "["+dst+"]:0")
	p := fmt.Sprint(port)
	run(t, l.env("a"), 20*time.Second, "conn", src, dst, p)
	run(t, l.env("a"), 20*time.Second, "threads", "4", "5", src, dst, p) // non-blocking connects among them
	run(t, l.env("a"), 20*time.Second, "dup", src, dst, p)
	// conn 1, threads 4 x 5, dup 2 connections.
	if n, bad := l.gw.opens.Load(), l.gw.badSrc.Load(); n != 1+4*5+2 || bad != 0 {
		t.Errorf("gateway saw %d OPENs (%d with a source outside site a), want %d (0)", n, bad, 1+4*5+2)
	}
	// A connection the client closes unused can sit in the listener's
	// backlog a moment after the client exits.
	for i := 0; i < 200 && acc.Load() < l.gw.opens.Load(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if acc.Load() != l.gw.opens.Load() {
		t.Errorf("destination accepted %d connections, gateway relayed %d", acc.Load(), l.gw.opens.Load())
	}

	// The destination, itself shimmed, sees the true IPv6 peer.
	sport := freePort(t, "["+dst+"]")
	srv := exec.Command(progPath, "serve", dst, fmt.Sprint(sport), "4", "fd5c:a::")
	srv.Env = l.env("b")
	var sout, serr strings.Builder
	srv.Stdout, srv.Stderr = &sout, &serr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	for i := 0; i < 200 && !strings.Contains(sout.String(), "listening"); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	for range 4 {
		run(t, l.env("a"), 20*time.Second, "conn", src, dst, fmt.Sprint(sport))
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("IPv6 destination: %v\n%s%s", err, sout.String(), serr.String())
	}
}
