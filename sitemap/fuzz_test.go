package sitemap

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics, and whatever it accepts writes out as
// canonical text that parses back to an equal map with the same text.
func FuzzParse(f *testing.F) {
	f.Add([]byte(twoSites))
	f.Add([]byte(keySites + "key s1 " + keyA + "\nkey s2 " + keyB + "\nkey s1 " + keyC + "\n"))
	f.Add([]byte("site a id=1 lan=127.0.0.1:7001 wan=127.0.0.1:7002\nhost a x 127.0.0.2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(bytes.NewReader(data), "fuzz")
		if err != nil {
			if m != nil {
				t.Fatal("Parse returned a map and an error")
			}
			return
		}
		var buf bytes.Buffer
		if _, err := m.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		text := buf.String()
		m2, err := Parse(bytes.NewReader(buf.Bytes()), "canonical")
		if err != nil {
			t.Fatalf("canonical text does not parse: %v\ninput:\n%q\ncanonical:\n%s", err, data, text)
		}
		if !reflect.DeepEqual(m.Sites(), m2.Sites()) {
			t.Fatalf("round trip changed the map:\n%s\nvs\n%s", text, m2)
		}
		if m2.String() != text {
			t.Fatalf("canonical text not stable:\n%s\nvs\n%s", text, m2)
		}
		for _, s := range m.Sites() {
			if got, ok := m.SiteByID(s.ID); !ok || got != s {
				t.Fatalf("SiteByID(%d)", s.ID)
			}
			for _, h := range s.Hosts {
				for _, a := range h.Addrs {
					if got, ok := m.Lookup(a); !ok || got != s {
						t.Fatalf("host %s address %s: Lookup = %v, want site %s", h.Name, a, got, s.Name)
					}
				}
			}
			for _, p := range s.Nets {
				if got, ok := m.Lookup(p.Addr()); !ok || got != s {
					t.Fatalf("net %s: Lookup = %v, want site %s", p, got, s.Name)
				}
			}
		}
	})
}
