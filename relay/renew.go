package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/mpi5k/mpi5k/header"
)

// writeRetire ends the writer of a link that has a successor, called with
// l.mu held and the queues empty: RETIRE is the last frame on the link, so
// the peer has every frame written before it.
func (l *Link) writeRetire(hb []byte) {
	l.retired = true
	l.writing = true // for good: anything sent from now on goes to succ
	l.mu.Unlock()
	header.Header{Type: header.TypeRetire}.Encode(hb)
	if _, err := l.conn.Write(hb); err != nil {
		l.fail(fmt.Errorf("relay: write to %v: %w", l.remoteAddr(), err))
		return
	}
	l.Stats.FramesSent.Add(1)
	l.active.Add(1)
	l.retireSent.Store(true)
	l.retireDone()
}

// retire makes succ this link's successor (see Link.succ); false when the
// link had already closed or retired.
func (l *Link) retire(succ *Link) bool {
	l.mu.Lock()
	if l.closed || l.succ != nil {
		l.mu.Unlock()
		return false
	}
	l.succ = succ
	l.mu.Unlock()
	kick(l.wake)
	return true
}

// Renews reports whether the trunk added l in place of a live link that it
// retired (a renewal). The retired link may have closed already: it ends
// as soon as RETIRE has crossed both ways.
func (l *Link) Renews() bool { return l.renews.Load() }

// Retiring reports whether the link has a successor and is ending.
func (l *Link) Retiring() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.succ != nil
}

// ErrLinkRetired is the Err of a link that a renewal replaced.
var ErrLinkRetired = errors.New("relay: link retired (renewed)")

// errPeerRetired stops the reader at the peer's RETIRE.
var errPeerRetired = errors.New("relay: peer retired the link")

// retireDone closes the link once RETIRE has crossed both ways.
func (l *Link) retireDone() {
	if !l.retireSent.Load() || !l.peerRetired.Load() {
		return
	}
	l.closeOnce.Do(func() {
		cbs := l.closing(ErrLinkRetired)
		if l.rs != nil {
			l.rs.release()
		}
		close(l.done)
		l.w.cancel()
		l.conn.Close() // no linger 0: our RETIRE may still be in the socket
		l.rd.stop()
		l.log.Debug("link retired", "peer", l.peer.Name, "link", l.index, "remote", l.remoteAddr())
		for _, f := range cbs {
			f(ErrLinkRetired)
		}
	})
}

// readEnd ends the reader of connection gen: at the peer's RETIRE
// cleanly, else as a break (a resuming link goes down) or a failure.
func (l *Link) readEnd(gen uint64, err error) {
	if err != errPeerRetired {
		l.broke(gen, readErr(err))
		return
	}
	l.peerRetired.Store(true)
	l.retireDone()
	if !l.Retiring() && l.t.dialer {
		// The acceptor replaced a link we still use, which happens only
		// when our side of that renewal failed: renew again.
		l.t.askRenew()
	}
}

// RenewGap is the shortest time between two renewals of a trunk's express
// link, which bounds the handshakes a lossy WAN can cost: the dialing side
// renews at most once per RenewGap, and StepExpress asks the peer (RENEW)
// at most as often.
const RenewGap = time.Second

// RequestRenew asks the peer, which dials this link, to renew it (RENEW),
// at most once per renewGap; false when it was not sent.
func (l *Link) RequestRenew(renewGap time.Duration) bool {
	now := time.Now().UnixNano()
	last := l.renewAsked.Load()
	if l.t.dialer || !l.renewable() || now-last < int64(renewGap) || !l.renewAsked.CompareAndSwap(last, now) {
		return false
	}
	return l.enqueue(frame{h: header.Header{Type: header.TypeRenew}}, nil)
}

// renewable: the link is an express link of a trunk whose peer renews.
func (l *Link) renewable() bool {
	return l.express && l.t.lanes && l.peer.Features&header.FeatureRenew != 0
}
