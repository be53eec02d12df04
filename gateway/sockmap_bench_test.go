package gateway

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// sockmapChain is the floor of forwarding on this machine with no relay
// process at all: two relay hops in front of dst whose sockets sit in a
// BPF sockmap, where an sk_skb verdict program moves every received skb to
// the other socket of its hop (bpf_sk_redirect_map, egress). The kernel
// forwards in softirq and kworker context; no user-space thread wakes up.
// There is no framing and no multiplexing: a gateway can only cost more.
// Skips without CAP_BPF. Each hop takes one connection; wait for ready
// after dialing the returned address and before sending: bytes that reach
// a hop's socket before it is in the map stay there.
func sockmapChain(b testing.TB, dst netip.AddrPort) (first netip.AddrPort, ready func()) {
	socks, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		b.Skipf("sockmap: %v", err)
	}
	b.Cleanup(func() { socks.Close() })
	// peer maps a socket, by (remote port as __sk_buff has it, local
	// port), to the sockmap index of the other socket of its hop.
	peer, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 4})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { peer.Close() })
	const (
		offRemotePort = 132 // struct __sk_buff
		offLocalPort  = 136
		skPass        = 1
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkSKB, License: "GPL", Instructions: asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, offRemotePort, asm.Word),
		asm.StoreMem(asm.RFP, -8, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, offLocalPort, asm.Word),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.LoadMapPtr(asm.R1, peer.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R3, asm.R0, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, socks.FD()),
		asm.Mov.Imm(asm.R4, 0), // egress: send on the other socket
		asm.FnSkRedirectMap.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	}})
	if err != nil {
		b.Skipf("sk_skb program: %v", err)
	}
	b.Cleanup(func() { prog.Close() })
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: socks.FD(), Program: prog, Attach: ebpf.AttachSkSKBVerdict}); err != nil {
		b.Skipf("attach sk_skb verdict: %v", err)
	}
	var mu sync.Mutex
	var conns []*net.TCPConn
	b.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	// key is the peer map key of socket c as the program builds it: the
	// kernel puts the remote port, in network byte order, in the upper
	// half of the word on little-endian machines.
	key := func(c *net.TCPConn) [8]byte {
		var k [8]byte
		var be [2]byte
		binary.BigEndian.PutUint16(be[:], uint16(c.RemoteAddr().(*net.TCPAddr).Port))
		binary.NativeEndian.PutUint32(k[0:], uint32(binary.NativeEndian.Uint16(be[:]))<<16)
		binary.NativeEndian.PutUint32(k[4:], uint32(c.LocalAddr().(*net.TCPAddr).Port))
		return k
	}
	add := func(i uint32, c *net.TCPConn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var uerr error
		rc.Control(func(fd uintptr) { uerr = socks.Put(i, uint32(fd)) })
		return uerr
	}
	next := dst
	var idx uint32
	var hops sync.WaitGroup
	for _, a := range []netip.Addr{gwB, gwA} {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: a.AsSlice()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		in, out, to := idx, idx+1, next
		idx += 2
		hops.Add(1)
		var once sync.Once
		go forwardEach(ln, to, func(c, d *net.TCPConn) {
			defer once.Do(hops.Done)
			mu.Lock()
			conns = append(conns, c, d)
			mu.Unlock()
			c.SetNoDelay(true)
			d.SetNoDelay(true)
			kc, kd := key(c), key(d)
			// Peers first: a socket in the map whose peer is unknown
			// would pass its bytes up to nobody.
			if peer.Put(kc, out) != nil || peer.Put(kd, in) != nil || add(in, c) != nil || add(out, d) != nil {
				b.Error("sockmap: cannot add a hop's sockets")
				c.Close()
				d.Close()
			}
		})
		next = ln.Addr().(*net.TCPAddr).AddrPort()
	}
	return next, hops.Wait
}
