package e2e

import (
	"regexp"
	"testing"
)

// siteLabel matches the site label every gateway series carries.
var siteLabel = regexp.MustCompile(`(\{)site="[^"]*",?|,site="[^"]*"`)

// dropSite returns an exposition line without its site label, so tests
// can name a series by its other labels: x{site="a"} 1 reads x 1.
func dropSite(line string) string {
	s := siteLabel.ReplaceAllString(line, "$1")
	return regexp.MustCompile(`\{\}`).ReplaceAllString(s, "")
}

func TestDropSite(t *testing.T) {
	for in, want := range map[string]string{
		`x{site="a"} 1`:                   `x 1`,
		`x{reason="d",site="a"} 1`:        `x{reason="d"} 1`,
		`x{site="a",peer="b"} 2`:          `x{peer="b"} 2`,
		`process_resident_memory_bytes 3`: `process_resident_memory_bytes 3`,
	} {
		if got := dropSite(in); got != want {
			t.Errorf("dropSite(%q) = %q, want %q", in, got, want)
		}
	}
}
