package sitemap

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
)

// KeyPrefix starts every public key in the text format: the algorithm is
// named so another one can be added without a new record.
const KeyPrefix = "ed25519:"

// ParseKey parses a public key written as "ed25519:" and the standard
// base64 of the key's 32 bytes (what `mpi5k-gateway --gen-key` prints).
func ParseKey(s string) (ed25519.PublicKey, error) {
	b64, ok := strings.CutPrefix(s, KeyPrefix)
	if !ok {
		return nil, fmt.Errorf("bad key %q: want %s<base64> as mpi5k-gateway --gen-key prints it", short(s), KeyPrefix)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(b64)
	// The decoder skips newlines: comparing the re-encoding keeps one
	// spelling per key.
	if err != nil || len(b) != ed25519.PublicKeySize || base64.StdEncoding.EncodeToString(b) != b64 {
		return nil, fmt.Errorf("bad key %q: want %s and the base64 of %d bytes (44 characters), as mpi5k-gateway --gen-key prints it",
			short(s), KeyPrefix, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// FormatKey writes k as ParseKey reads it.
func FormatKey(k ed25519.PublicKey) string {
	return KeyPrefix + base64.StdEncoding.EncodeToString(k)
}

// short keeps an error message about a malformed key readable.
func short(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

type keyRec struct {
	at   pos
	site string
	key  ed25519.PublicKey
}

// AddKey lists k as a public key of site's gateway (several keys per
// site: a new one is listed beside the old one while the gateway changes
// its private key).
func (b *Builder) AddKey(site string, k ed25519.PublicKey) *Builder {
	b.recs.keys = append(b.recs.keys, keyRec{at: b.next(), site: site, key: slices.Clone(k)})
	return b
}

// HasKeys reports whether the map lists gateway keys: its WAN links are
// then authenticated and encrypted.
func (m *Map) HasKeys() bool {
	for _, s := range m.sites {
		if len(s.Keys) > 0 {
			return true
		}
	}
	return false
}

// SiteByKey returns the site that lists public key k.
func (m *Map) SiteByKey(k ed25519.PublicKey) (*Site, bool) {
	for _, s := range m.sites {
		for _, sk := range s.Keys {
			if bytes.Equal(sk, k) {
				return s, true
			}
		}
	}
	return nil, false
}

// buildKeys attaches the key records to their sites: a key must name a
// known site, appear once, and belong to one site only (a key is a site's
// identity). Once one site has a key every site needs one: a keyless site
// among keyed ones would be a way around the authentication.
func (r *records) buildKeys(m *Map, knownBroken map[string]bool, fail func(pos, string, ...any)) {
	owner := map[string]keyRec{}
	for _, k := range r.keys {
		s := m.byName[k.site]
		if s == nil {
			if !knownBroken[k.site] {
				fail(k.at, "key for unknown site %s", k.site)
			}
			continue
		}
		if o, dup := owner[string(k.key)]; dup {
			if o.site == k.site {
				fail(k.at, "key %s listed twice for site %s (first at %s)", FormatKey(k.key), k.site, o.at)
			} else {
				fail(k.at, "key %s of site %s is already the key of site %s (%s): each site needs its own key (mpi5k-gateway --gen-key)",
					FormatKey(k.key), k.site, o.site, o.at)
			}
			continue
		}
		owner[string(k.key)] = k
		s.Keys = append(s.Keys, k.key)
	}
	if len(owner) == 0 {
		return
	}
	for _, s := range m.sites {
		if len(s.Keys) == 0 {
			fail(siteAtOf(r, s.Name), "site %s has no key while other sites have: add \"key %s ed25519:...\" with the key its gateway's --gen-key printed",
				s.Name, s.Name)
		}
	}
}

func siteAtOf(r *records, name string) pos {
	for _, s := range r.sites {
		if s.name == name {
			return s.at
		}
	}
	return pos{}
}

// Dials reports whether the gateway of site a opens the WAN links between
// a and b (the other one accepts them): a site behind NAT dials, since it
// cannot be reached; otherwise the lower id does. Every gateway reads the
// same map, so the two agree.
func Dials(a, b *Site) bool {
	if a.NAT != b.NAT {
		return a.NAT
	}
	return a.ID < b.ID
}

// checkNAT: a site behind NAT is recognised by its key, never by the
// address its connections come from, so it needs a keyed map; and two
// sites behind NAT could never reach each other.
func (r *records) checkNAT(m *Map, fail func(pos, string, ...any)) {
	var nat []*Site
	for _, s := range m.sites {
		if s.NAT {
			nat = append(nat, s)
		}
	}
	if len(nat) == 0 {
		return
	}
	if !m.HasKeys() {
		fail(siteAtOf(r, nat[0].Name), "site %s: nat=yes needs gateway keys: a gateway behind NAT is recognised by its key, not by its address (add a key record per site, docs/security.md)", nat[0].Name)
	}
	if len(nat) > 1 {
		fail(siteAtOf(r, nat[1].Name), "sites %s and %s are both nat=yes: neither gateway could reach the other; give one of them a wan= address the other can connect to",
			nat[0].Name, nat[1].Name)
	}
}
