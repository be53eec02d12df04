// Command floorgw is a measuring tool, not part of mpi5k: the simplest
// gateway the shim can use, so that real MPI codes can run through a plain
// split-TCP relay pair beside the mpi5k gateways and the cost any relay
// pays on a machine can be told apart from what the gateways add or save.
//
// It speaks the shim's side of the LAN protocol (docs/wire-format.md:
// OPEN, PEER_QUERY, LISTEN) and nothing of the WAN protocol: each stream
// gets a WAN TCP connection of its own, opened when the stream opens, with
// the host's congestion control and buffers, that carries one frame naming
// the two endpoints and then the stream's bytes; each direction is an
// io.Copy (splice(2) between two sockets). No aggregation, no warm links,
// no flow control of its own, no keys, no encryption, no resume.
//
// `mpi5k run --gateway-bin bin/floorgw --wan-plaintext` starts it in place
// of mpi5k-gateway, with the flags the wrapper gives a gateway; /ready
// answers once it listens, and /metrics carries the process's CPU time and
// the WAN bytes of ended streams, which the wrapper's summary (and so
// mpi5k bench) reads. Any other gateway flag is refused by name.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/sitemap"
)

type relay struct {
	m    *sitemap.Map
	site *sitemap.Site
	lan  netip.AddrPort // this host's LAN listener; its address is the far side's source
	tag  string

	mu    sync.Mutex
	peers map[[2]netip.AddrPort]netip.AddrPort // (our local end, destination) -> true source
	bytes map[string]*[2]atomic.Uint64         // peer site -> tx, rx on the WAN
}

func main() {
	log.SetPrefix("floorgw: ")
	log.SetFlags(0)
	fs := flag.NewFlagSet("floorgw", flag.ContinueOnError)
	mapPath := fs.String("map", "", "site map")
	site := fs.String("site", "", "this gateway's site")
	metrics := fs.String("metrics", "", "HTTP listener for /ready and /metrics")
	lanFlag := fs.String("lan", "", "LAN listener (default: the site's lan=)")
	wanFlag := fs.String("wan", "", "WAN listener (default: the site's wan=)")
	tag := fs.String("ready-tag", "", "answer /ready?tag=X only for this X")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "exit when standard input ends")
	if err := fs.Parse(os.Args[1:]); err != nil {
		log.Fatalf("%v (floorgw takes only the flags mpi5k run gives every gateway; run the job with --wan-plaintext and no gateway tuning flags)", err)
	}
	if *mapPath == "" || *site == "" {
		log.Fatal("--map and --site are needed")
	}
	m, err := sitemap.Load(*mapPath)
	if err != nil {
		log.Fatal(err)
	}
	if m.HasKeys() {
		log.Fatalf("site map %s lists gateway keys: floorgw has no cipher; run the job with --wan-plaintext", *mapPath)
	}
	s, ok := m.Site(*site)
	if !ok {
		log.Fatalf("site %q is not in %s", *site, *mapPath)
	}
	lan, wan := s.LAN, s.WAN
	if *lanFlag != "" {
		if lan, err = netip.ParseAddrPort(*lanFlag); err != nil {
			log.Fatalf("--lan %q: %v", *lanFlag, err)
		}
	}
	if *wanFlag != "" {
		if wan, err = netip.ParseAddrPort(*wanFlag); err != nil {
			log.Fatalf("--wan %q: %v", *wanFlag, err)
		}
	}
	r, err := newRelay(m, s, lan, *tag)
	if err != nil {
		log.Fatal(err)
	}
	lanL, err := net.Listen("tcp", lan.String())
	if err != nil {
		log.Fatal(err)
	}
	wanL, err := net.Listen("tcp", wan.String())
	if err != nil {
		log.Fatal(err)
	}
	if *metrics != "" {
		ml, err := net.Listen("tcp", *metrics)
		if err != nil {
			log.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/ready", r.ready)
		mux.HandleFunc("/metrics", r.metrics)
		go func() { log.Fatal(http.Serve(ml, mux)) }()
	}
	if *stdinEOF {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}()
	}
	go func() { log.Fatal(serve(wanL, r.fromWAN)) }()
	log.Fatal(serve(lanL, r.fromLAN))
}

// newRelay is site s's relay, its LAN listener at lan.
func newRelay(m *sitemap.Map, s *sitemap.Site, lan netip.AddrPort, tag string) (*relay, error) {
	if !lan.Addr().Is4() || lan.Addr().IsUnspecified() {
		return nil, fmt.Errorf("LAN address %v: floorgw connects from it and needs an IPv4 host address", lan)
	}
	r := &relay{m: m, site: s, lan: lan, tag: tag, peers: map[[2]netip.AddrPort]netip.AddrPort{}, bytes: map[string]*[2]atomic.Uint64{}}
	for _, p := range m.Sites() {
		if p != s {
			r.bytes[p.Name] = new([2]atomic.Uint64)
		}
	}
	return r, nil
}

// serve hands each connection l accepts to handle until l fails.
func serve(l net.Listener, handle func(*net.TCPConn)) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go handle(c.(*net.TCPConn))
	}
}

// fromLAN serves a rank's connection: an OPEN to relay, or a control
// connection of PEER_QUERY and LISTEN frames.
func (r *relay) fromLAN(c *net.TCPConn) {
	h, p, err := header.ReadOne(c, 1<<16)
	if err != nil {
		abort(c, "LAN %v: %v", c.RemoteAddr(), err)
		return
	}
	switch h.Type {
	case header.TypeOpen:
		r.open(c, p)
	case header.TypePeerQuery, header.TypeListen:
		r.control(c, h, p)
	default:
		abort(c, "LAN %v: first frame %v", c.RemoteAddr(), h.Type)
	}
}

func (r *relay) open(c *net.TCPConn, body []byte) {
	o, err := header.ParseOpen(body)
	if err != nil {
		abort(c, "OPEN from %v: %v", c.RemoteAddr(), err)
		return
	}
	dst, ok := r.m.Lookup(o.Dst.Addr())
	if !ok || dst == r.site {
		abort(c, "OPEN from %v: destination %v is in no other site", c.RemoteAddr(), o.Dst)
		return
	}
	w, err := net.Dial("tcp", dst.WAN.String())
	if err != nil {
		abort(c, "dial %s's gateway %v: %v", dst.Name, dst.WAN, err)
		return
	}
	meta, err := header.AppendEndpointPair(nil, o.Src, o.Dst)
	if err == nil {
		_, err = w.Write(header.AppendFrame(nil, header.TypeOpen, 0, meta))
	}
	if err != nil {
		w.Close()
		abort(c, "open to %v: %v", o.Dst, err)
		return
	}
	r.join(c, w.(*net.TCPConn), dst.Name)
}

// fromWAN serves a peer's stream: one frame with the two endpoints, then
// the stream's bytes, delivered from this gateway's LAN address so that the
// destination's shim can ask who the true source is.
func (r *relay) fromWAN(w *net.TCPConn) {
	_, p, err := header.ReadOne(w, 1<<10)
	var src, dst netip.AddrPort
	if err == nil {
		src, dst, err = header.ParseEndpointPair(p)
	}
	if err != nil {
		abort(w, "WAN %v: %v", w.RemoteAddr(), err)
		return
	}
	from, ok := r.m.Lookup(src.Addr())
	if !ok {
		abort(w, "WAN %v: source %v is in no site", w.RemoteAddr(), src)
		return
	}
	var key [2]netip.AddrPort
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		// Bound and recorded before connect: the destination may ask as
		// soon as it accepts, before connect returns here.
		var err error
		cerr := rc.Control(func(fd uintptr) {
			a4 := r.lan.Addr().As4()
			if err = syscall.Bind(int(fd), &syscall.SockaddrInet4{Addr: a4}); err != nil {
				return
			}
			var sa syscall.Sockaddr
			if sa, err = syscall.Getsockname(int(fd)); err == nil {
				key = [2]netip.AddrPort{netip.AddrPortFrom(r.lan.Addr(), uint16(sa.(*syscall.SockaddrInet4).Port)), dst}
				r.mu.Lock()
				r.peers[key] = src
				r.mu.Unlock()
			}
		})
		return errors.Join(cerr, err)
	}}
	c, err := d.DialContext(context.Background(), "tcp4", dst.String())
	if err != nil {
		r.forget(key)
		abort(w, "connect %v for %v: %v", dst, src, err)
		return
	}
	r.join(c.(*net.TCPConn), w, from.Name)
	r.forget(key)
}

func (r *relay) forget(key [2]netip.AddrPort) {
	r.mu.Lock()
	delete(r.peers, key)
	r.mu.Unlock()
}

// join copies both ways between a LAN and a WAN connection until both
// directions end, each end half-closed after its direction.
func (r *relay) join(lan, wan *net.TCPConn, peer string) {
	ctr := r.bytes[peer]
	done := make(chan struct{})
	go func() {
		n, _ := io.Copy(lan, wan)
		ctr[1].Add(uint64(n))
		lan.CloseWrite()
		close(done)
	}()
	n, _ := io.Copy(wan, lan)
	ctr[0].Add(uint64(n))
	wan.CloseWrite()
	<-done
	lan.Close()
	wan.Close()
}

// control answers PEER_QUERY and LISTEN frames until the connection ends.
func (r *relay) control(c *net.TCPConn, h header.Header, p []byte) {
	defer c.Close()
	for {
		var reply []byte
		switch h.Type {
		case header.TypePeerQuery:
			q, err := header.ParsePeerQuery(p)
			if err != nil {
				abort(c, "PEER_QUERY: %v", err)
				return
			}
			r.mu.Lock()
			src, ok := r.peers[[2]netip.AddrPort{q.Seen, q.Local}]
			r.mu.Unlock()
			pr := header.PeerReply{Source: netip.AddrPortFrom(netip.IPv4Unspecified(), 0)}
			if ok {
				s, _ := r.m.Lookup(src.Addr())
				pr = header.PeerReply{Found: true, SiteID: s.ID, Source: src}
			}
			reply = header.AppendFrame(nil, header.TypePeerReply, h.Stream, header.AppendPeerReply(nil, &pr))
		case header.TypeListen:
			// Every port is open to every site: floorgw has no policy.
			reply = header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOK})
		default:
			abort(c, "control connection: frame %v", h.Type)
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
		var err error
		if h, p, err = header.ReadOne(c, 1<<10); err != nil {
			return
		}
	}
}

// abort resets c (as a gateway refuses: SO_LINGER 0) and says why.
func abort(c *net.TCPConn, format string, args ...any) {
	log.Printf(format, args...)
	c.SetLinger(0)
	c.Close()
}

func (r *relay) ready(w http.ResponseWriter, req *http.Request) {
	if t := req.URL.Query().Get("tag"); t != "" && r.tag != "" && t != r.tag {
		http.Error(w, "another job's gateway", http.StatusConflict)
		return
	}
	fmt.Fprintln(w, "ready")
}

// metrics writes what the wrapper's summary reads, in Prometheus' text
// format: the process's user + system CPU and the WAN bytes of the
// streams that have ended.
func (r *relay) metrics(w http.ResponseWriter, _ *http.Request) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\n", cpu)
	fmt.Fprintf(&b, "# TYPE mpi5k_wan_bytes_total counter\n")
	for peer, c := range r.bytes {
		fmt.Fprintf(&b, "mpi5k_wan_bytes_total{dir=\"tx\",peer=%q} %d\n", peer, c[0].Load())
		fmt.Fprintf(&b, "mpi5k_wan_bytes_total{dir=\"rx\",peer=%q} %d\n", peer, c[1].Load())
	}
	io.WriteString(w, b.String())
}
