package relay

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
)

// BenchmarkCopyPath compares the two ways of moving one stream's payload
// from its LAN socket onto the WAN socket as framed DATA, on loopback:
//
//   - readv: read(2) into a user buffer, then writev(2) header + payload
//     (what the relay does; a second buffer lets the next read overlap the
//     write when the out-stage and the link writer run on different cores);
//   - splice: splice(2) LAN socket -> pipe (length learnt), send(2) the
//     header with MSG_MORE, splice(2) pipe -> WAN socket: no user copy, but
//     three system calls per chunk and no way to batch frames of several
//     streams into one write.
//
// Both report bytes/s and the process CPU per GB (source and sink included,
// identical for both).
func BenchmarkCopyPath(b *testing.B) {
	for _, chunk := range []int{64 << 10, 128 << 10} {
		b.Run("readv/"+sizeName(chunk), func(b *testing.B) { copyBench(b, chunk, false) })
		b.Run("splice/"+sizeName(chunk), func(b *testing.B) { copyBench(b, chunk, true) })
	}
}

func sizeName(n int) string {
	return map[int]string{64 << 10: "64KiB", 128 << 10: "128KiB"}[n]
}

// tcpPair returns the dialing and the accepted end of a loopback TCP
// connection.
func tcpPair(b testing.TB) (*net.TCPConn, *net.TCPConn) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c1, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		b.Fatal(err)
	}
	c2, err := ln.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	return c1, c2
}

func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func copyBench(b *testing.B, chunk int, splice bool) {
	src, lanIn := tcpPair(b) // application -> gateway LAN socket
	wanOut, sink := tcpPair(b)
	defer src.Close()
	defer lanIn.Close()
	defer wanOut.Close()
	defer sink.Close()
	const total = 1 << 20 // per iteration
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := src.Write(buf); err != nil {
				return
			}
		}
	}()
	go io.Copy(io.Discard, sink)
	b.SetBytes(total)
	c0 := cpu()
	b.ResetTimer()
	if splice {
		spliceLoop(b, lanIn, wanOut, chunk, total)
	} else {
		readvLoop(b, lanIn, wanOut, chunk, total)
	}
	b.StopTimer()
	b.ReportMetric(float64((cpu()-c0).Milliseconds())/(float64(b.N)*total/1e9), "cpu-ms/GB")
}

func readvLoop(b *testing.B, in, out *net.TCPConn, chunk, total int) {
	buf := make([]byte, chunk)
	var hb [header.Size]byte
	for range b.N {
		for moved := 0; moved < total; {
			n, err := in.Read(buf[:min(chunk, total-moved)])
			if err != nil {
				b.Fatal(err)
			}
			header.Header{Type: header.TypeData, Stream: 1, Length: uint32(n)}.Encode(hb[:])
			iov := net.Buffers{hb[:], buf[:n]}
			if _, err := iov.WriteTo(out); err != nil {
				b.Fatal(err)
			}
			moved += n
		}
	}
}

func spliceLoop(b *testing.B, in, out *net.TCPConn, chunk, total int) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, chunk)
	inRC, _ := in.SyscallConn()
	outRC, _ := out.SyscallConn()
	var hb [header.Size]byte
	for range b.N {
		for moved := 0; moved < total; {
			var n int64
			var serr error
			// Blocking in the poller until the LAN socket has data.
			inRC.Read(func(fd uintptr) bool {
				n, serr = unix.Splice(int(fd), nil, p[1], nil, min(chunk, total-moved), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				return serr != unix.EAGAIN
			})
			if serr != nil || n <= 0 {
				b.Fatalf("splice in: %d %v", n, serr)
			}
			header.Header{Type: header.TypeData, Stream: 1, Length: uint32(n)}.Encode(hb[:])
			outRC.Write(func(fd uintptr) bool {
				_, serr = unix.SendmsgN(int(fd), hb[:], nil, nil, unix.MSG_MORE)
				return serr != unix.EAGAIN
			})
			if serr != nil {
				b.Fatal(serr)
			}
			for left := n; left > 0; {
				var k int64
				outRC.Write(func(fd uintptr) bool {
					k, serr = unix.Splice(p[0], nil, int(fd), nil, int(left), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
					return serr != unix.EAGAIN
				})
				if serr != nil {
					b.Fatal(serr)
				}
				left -= k
			}
			moved += int(n)
		}
	}
}
