package gateway

import (
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/sitemap"
)

// Keys change without a restart (docs/deploy.md, "Rotating a key"): a
// reload reads the map's key records and this gateway's key file again.
// New WAN connections prove and check the keys of the new map at once. A
// working link whose peer proved a key the new map no longer lists for
// its site is broken and resumed on a new connection, which must prove a
// listed key: no link outlives the removal of the key it was made with,
// and, when the peer holds a listed key, no stream is lost.

// reloadAuth prepares the authentication of map m, in which this
// gateway's site is s: nil for a keyless map. A reload never switches
// between keyless and keyed (that takes a restart, with or without
// --key).
func (g *Gateway) reloadAuth(m *sitemap.Map, s *sitemap.Site) (*authState, error) {
	switch {
	case m.HasKeys() && g.auth == nil:
		return nil, errors.New("the new site map lists gateway keys and the one in force does not: restart the gateway with --key to turn authentication on")
	case !m.HasKeys() && g.auth != nil:
		return nil, errors.New("the new site map lists no gateway keys: a reload never turns authentication off; restart the gateway without --key to run keyless")
	case g.auth == nil:
		return nil, nil
	}
	key, path := g.cfg.Key, g.cfg.KeyFile
	if path != "" {
		// Read again: the key file may hold a new key (rotation).
		k, err := LoadKey(path)
		if err != nil {
			return nil, err
		}
		key = k
	} else {
		path = "(Config.Key)"
	}
	return newAuthState(m, s, key, path)
}

// setAuth puts st in force (after the map, under peersMu: a handshake
// that sees the new map sees the new keys); it reports whether this
// gateway's own key changed.
func (g *Gateway) setAuth(st *authState) (newKey bool) {
	if st == nil {
		return false
	}
	old := g.auth.cur.Swap(st)
	oldPub := old.cert.PrivateKey.(ed25519.PrivateKey).Public().(ed25519.PublicKey)
	newPub := st.cert.PrivateKey.(ed25519.PrivateKey).Public().(ed25519.PublicKey)
	return !oldPub.Equal(newPub)
}

// reauthenticate breaks the links of peers whose proven key m no longer
// lists for their site, and returns those peers' names.
func (g *Gateway) reauthenticate(m *sitemap.Map) []string {
	if g.auth == nil {
		return nil
	}
	var names []string
	for _, p := range g.peerList() {
		stale := 0
		for _, l := range g.linksOf(p) {
			sc, ok := l.Conn().(*relay.SealedConn)
			if !ok {
				continue
			}
			k, ok := sc.Peer.(ed25519.PublicKey)
			if !ok {
				continue
			}
			if s, ok := m.SiteByKey(k); ok && s.ID == p.site.ID {
				continue
			}
			stale++
			why := fmt.Errorf("the peer proved key %s, which the reloaded site map no longer lists for site %s", sitemap.FormatKey(k), p.site.Name)
			if l.Resumable() {
				l.Break(why) // the dialer resumes it on a connection that proves a listed key
			} else {
				l.Close()
			}
		}
		if stale > 0 {
			names = append(names, p.name)
			g.log.Warn("WAN links made with a key no longer listed are broken: they resume only with a listed key",
				"peer", p.name, "links", stale)
		}
	}
	return names
}
