package tuning

import (
	"time"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/tcpinfo"
)

// Priming a BBR WAN link.
//
// BBR paces a socket at the highest delivery rate it has measured, and it
// keeps an app-limited sample only when the sample beats that rate
// (tcp_bbr.c, bbr_update_bw). A link that carries only messages sends
// nothing but app-limited bursts, so a fresh one never learns the path: each
// message is paced at a small multiple of the rate of the one before, and in
// the lab a 16 KiB ping-pong over a BBR express link took 17.0 ms per half
// round trip against 10.8 over CUBIC. A bulk link learns from large
// transfers, but once STARTUP has ended on an estimate that bursts left low
// it probes for more only 25 % per eight round trips. Once BBR has measured
// the path it keeps the rate while the link carries app-limited bursts, but
// not across a loss: the primed sample leaves BBR's max filter after 10
// round trips, and the first sample that is not app-limited, a
// retransmission's, then replaces it (196 -> 2.6 Mbit/s at 0.1 % loss on
// the lab; bench/figures/bbrexpress). That is why the express link stays
// CUBIC by default.
//
// So the gateway fills each new BBR link with PAD frames (filler the peer
// discards) until BBR leaves STARTUP, which it does once its estimate has
// not grown by 25 % in three round trips: the path's rate. The primer then
// waits for the bottleneck queue that STARTUP built to drain.
//
// An express link may stop earlier, once the estimate has passed that same
// test by the primer's own reading. BBR applies it only to samples the
// application did not limit, which the filler cannot always promise on a
// busy host, and a path whose ACKs come in bursts (the lab's emulated WAN)
// keeps it from ending for a long time; the estimate is what messages
// need. An express link left in STARTUP stays there, since it carries only
// messages, and paces them at 2.89 times the estimate: as fast as the path
// goes. A bulk link must not stay there: its first large transfers would
// run at STARTUP's gains and fill the bottleneck queue in front of every
// message (BT 1.12-1.16 times direct's time on the lab, 0.98-0.99 with
// bulk links primed to the end of STARTUP). The filler goes through the link's
// writer like bulk, one frame at a time, so messages go ahead of it, and
// TCP_NOTSENT_LOWAT keeps the socket's unsent queue short. One link of a
// site pair primes at a time, so each measures the whole path, and the
// gateway reports ready only when its links are primed.

const (
	// primePad is the filler per PAD frame.
	primePad = 64 << 10
	// primePoll is how often the primer looks at the socket while the
	// queue drains.
	primePoll = time.Millisecond
	// primeGrowth and primeRounds: the estimate has stopped growing when
	// it has not grown by primeGrowth for primeRounds round trips (and at
	// least primeMinFlat).
	primeGrowth  = 1.25
	primeRounds  = 3
	primeMinFlat = 5 * time.Millisecond
	// primeDrained: the queue has drained when at most this many segments
	// are in flight.
	primeDrained = 4
	// PrimeMaxTime ends priming of a path whose rate BBR cannot settle.
	PrimeMaxTime = 3 * time.Second
	// primeMinBytes and primeBDPs bound the filler: STARTUP normally ends
	// within a dozen bandwidth-delay products (on the lab it took 12-16
	// with the estimate 35 % above the emulated rate), and a path of tiny
	// BDP (loopback) never needs more than a few MiB.
	primeMinBytes = 8 << 20
	primeBDPs     = 24
)

// PrimeResult is what priming did, for the log and the tests.
type PrimeResult struct {
	Primed  bool          // the estimate stopped growing (or BBR left STARTUP)
	Skipped string        // why the link was not primed ("" if it was tried)
	Bytes   uint64        // PAD payload bytes written
	Took    time.Duration // until the queue drained, or priming gave up
	BW      uint64        // BBR's bandwidth estimate at the end, bytes/s
	Mode    tcpinfo.BBRMode
	Err     error // the link failed or a socket read failed
}

// Prime pads link l until its BBR has left STARTUP (or, if early, its
// estimate has stopped growing), then waits for the queue to drain (see
// above), for at most maxTime. It returns at once for a link that is not
// BBR or a peer that does not take PAD.
func Prime(l *relay.Link, early bool, maxTime time.Duration) PrimeResult {
	var (
		res     PrimeResult
		cc      string
		raw     tcpinfo.Raw
		in      tcpinfo.Info
		bbr     tcpinfo.BBR
		t0      = time.Now()
		ref     uint64    // the estimate at the last growth
		grew    time.Time // when it grew by primeGrowth
		padding = true
		poll    *time.Timer
	)
	for {
		have, err := ReadLinkSocket(l, &cc, &raw, &in, &bbr)
		now := time.Now()
		res.Took = now.Sub(t0)
		switch {
		case err != nil:
			res.Err = err
			return res
		case cc != "bbr":
			res.Skipped = "congestion control " + cc
			return res
		case !have:
			res.Skipped = "no BBR state (TCP_CC_INFO)"
			return res
		}
		res.BW, res.Mode = bbr.Bandwidth, bbr.Mode()
		if float64(bbr.Bandwidth) >= primeGrowth*float64(ref) {
			ref, grew = bbr.Bandwidth, now
		}
		if padding {
			flat := max(primeRounds*bbr.MinRTT, primeMinFlat)
			bdp := float64(bbr.Bandwidth) * bbr.MinRTT.Seconds()
			switch {
			case bbr.Bandwidth > 0 && (res.Mode != tcpinfo.BBRStartup || early && now.Sub(grew) >= flat):
				res.Primed = true
				padding = false
			case res.Bytes >= uint64(max(primeMinBytes, primeBDPs*bdp)) || res.Took >= maxTime:
				padding = false
			}
		}
		if padding {
			n, err := l.Pad(primePad)
			if err != nil {
				if err == relay.ErrNoPad {
					res.Skipped = "peer takes no PAD"
				} else {
					res.Err = err
				}
				return res
			}
			res.Bytes += uint64(n)
			continue
		}
		if in.Unacked <= primeDrained || res.Took >= maxTime {
			return res
		}
		if poll == nil {
			poll = time.NewTimer(primePoll)
			defer poll.Stop()
		} else {
			poll.Reset(primePoll)
		}
		select {
		case <-poll.C:
		case <-l.Done():
			res.Err = l.Err()
			return res
		}
	}
}
