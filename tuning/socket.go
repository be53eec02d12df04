package tuning

import (
	"errors"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// ReadLinkSocket reads, in one Control of l's socket, its TCP_INFO into in
// (raw is scratch) and, if it runs BBR, BBR's model into b (haveBBR). *cc
// caches the socket's congestion control; an empty one is read first.
func ReadLinkSocket(l *relay.Link, cc *string, raw *tcpinfo.Raw, in *tcpinfo.Info, b *tcpinfo.BBR) (haveBBR bool, err error) {
	sc := relay.TCPOf(l.Conn()) // through an encrypting wrapper
	if sc == nil {
		return false, errors.New("tuning: WAN link without a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	cerr := rc.Control(func(fd uintptr) {
		if err = tcpinfo.Read(int(fd), raw, in); err != nil {
			return
		}
		if *cc == "" {
			*cc, _ = tcpinfo.CongestionControl(int(fd))
		}
		if *cc == "bbr" {
			haveBBR, _ = tcpinfo.ReadBBR(int(fd), b)
		}
	})
	if cerr != nil {
		return false, cerr
	}
	return haveBBR, err
}

// LinkSet answers "is l among the gateway's links" in constant time: the
// sampler and the PROBE_RTT guard ask it for each link they track, and a
// scan of the list made each of their rounds quadratic (15 % of a hub's
// idle CPU with 508 links, BenchmarkScaleHub). The map is kept and
// cleared, not rebuilt, so a round allocates nothing.
type LinkSet struct{ m map[*relay.Link]struct{} }

// Reset makes the set hold exactly ls.
func (s *LinkSet) Reset(ls []*relay.Link) {
	if s.m == nil {
		s.m = make(map[*relay.Link]struct{}, len(ls))
	}
	clear(s.m)
	for _, l := range ls {
		s.m[l] = struct{}{}
	}
}

// Has reports whether l is in the set.
func (s *LinkSet) Has(l *relay.Link) bool {
	_, ok := s.m[l]
	return ok
}
