// Command gorelay is a measuring tool, not part of mpi5k: the simplest split
// TCP relay Go's standard library makes. It accepts connections on -listen,
// dials -to for each, and copies both directions with io.Copy, one
// goroutine per direction. bench/relayfloor.sh chains two of them across the
// lab's WAN beside the gateways and socat, so that what any Go relay costs
// per message (the runtime's scheduler and network poller) can be told
// apart from what the gateways add to it.
//
// usage: gorelay -listen ADDR:PORT -to ADDR:PORT
package main

import (
	"flag"
	"io"
	"log"
	"net"
)

func main() {
	listen := flag.String("listen", "", "address to accept connections on")
	to := flag.String("to", "", "address to dial for each accepted connection")
	flag.Parse()
	if *listen == "" || *to == "" {
		log.Fatal("gorelay: -listen and -to are both needed")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go relay(c.(*net.TCPConn), *to)
	}
}

// relay joins an accepted connection to a fresh one to the target.
func relay(a *net.TCPConn, to string) {
	d, err := net.Dial("tcp", to)
	if err != nil {
		log.Print(err)
		a.Close()
		return
	}
	b := d.(*net.TCPConn)
	// Go sets TCP_NODELAY on new connections already; set it again so the
	// tool does not depend on that default: a small message must leave at
	// once, as with socat's nodelay, or the comparison is with Nagle.
	a.SetNoDelay(true)
	b.SetNoDelay(true)
	done := make(chan struct{})
	go func() {
		pipe(b, a)
		close(done)
	}()
	pipe(a, b)
	<-done
	a.Close()
	b.Close()
}

// pipe copies src to dst until src ends, then half-closes dst so the end
// of the stream reaches the far side while the other direction goes on.
// Between two TCPConns io.Copy uses splice(2) on Linux, as a relay written
// plainly would.
func pipe(dst, src *net.TCPConn) {
	io.Copy(dst, src)
	dst.CloseWrite()
}
