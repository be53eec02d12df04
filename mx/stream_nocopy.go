package mx

import "fmt"

// WriteNoCopy sends p as Write does, in messages of at most Chunk bytes
// within the peer's window, but without copying it: a forwarder that owns
// its buffers (the gateway's two-buffer forwarding) hands them over as
// they are. It returns once every message is handed to the engine, with
// their requests appended to reqs; p must stay unchanged until all of
// them are done (the peer pulls a rendezvous message from p itself).
func (s *Stream) WriteNoCopy(p []byte, reqs []*Request) ([]*Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for done := 0; done < len(p); {
		for s.credit == 0 && s.err == nil && !s.wclosed && !s.closed {
			s.cond.Wait()
		}
		switch {
		case s.err != nil:
			return reqs, s.err
		case s.wclosed || s.closed:
			return reqs, fmt.Errorf("mx stream %d: write after close", s.id)
		}
		n := min(len(p)-done, s.cfg.Chunk, s.credit)
		r, err := s.ep.Isend(s.peer, streamMatch(s.id, s.dialer, kindData), p[done:done+n])
		if err != nil {
			return reqs, fmt.Errorf("mx stream %d with %v: %w", s.id, s.peer, err)
		}
		s.credit -= n
		reqs = append(reqs, r)
		done += n
	}
	return reqs, nil
}
