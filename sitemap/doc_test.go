package sitemap

import (
	"os"
	"strings"
	"testing"
)

// TestDocExamples keeps docs/sitemap-format.md honest: every fenced block
// that starts with a record or a comment (not the <placeholder> grammar)
// must parse.
func TestDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/sitemap-format.md")
	if err != nil {
		t.Skip("docs not found:", err)
	}
	blocks := strings.Split(string(doc), "```")
	n := 0
	for i := 1; i < len(blocks); i += 2 {
		b := strings.TrimPrefix(blocks[i], "\n")
		if strings.Contains(b, "<") || !strings.HasPrefix(b, "site ") && !strings.HasPrefix(b, "# ") {
			continue
		}
		n++
		m, err := Parse(strings.NewReader(b), "docs example")
		if err != nil {
			t.Errorf("example %d does not parse: %v\n%s", n, err, b)
			continue
		}
		if len(m.Sites()) != 2 {
			t.Errorf("example %d: %d sites, want 2", n, len(m.Sites()))
		}
	}
	if n < 2 {
		t.Errorf("found %d examples in the doc, want 2", n)
	}
}
