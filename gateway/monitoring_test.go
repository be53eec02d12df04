package gateway

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMonitoringFiles: every metric the shipped alert rules and Grafana
// dashboard (dist/prometheus) name is one a running gateway exports, so
// renaming a metric without them fails here; and promtool, where
// installed, finds the gateway's exposition clean.
func TestMonitoringFiles(t *testing.T) {
	// PINGs every 100 ms, so the frame round-trip histogram fills at once.
	_, a, _ := startPair(t, func(c *Config) { c.PingInterval, c.DeadAfter = 100*time.Millisecond, 30*time.Second })
	// Series that exist only once something happened: a refusal, a
	// degradation, the first TCP_INFO samples of the links.
	a.refused("test_reason", "a refusal, so mpi5k_refusals_total has a series")
	a.degrade("test_feature")
	var scrape string
	for deadline := time.Now().Add(10 * time.Second); ; {
		rec := httptest.NewRecorder()
		a.m.handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		scrape = rec.Body.String()
		if strings.Contains(scrape, "mpi5k_wan_tcp_rtos_total{") && strings.Contains(scrape, "mpi5k_wan_frame_rtt_seconds_count{") ||
			time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(scrape, -1) {
		exported[m[1]] = true
		if m[2] == "histogram" || m[2] == "summary" {
			exported[m[1]+"_count"], exported[m[1]+"_sum"], exported[m[1]+"_bucket"] = true, true, true
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^(\w+)\{[^}]*site="a"`).FindAllStringSubmatch(scrape, -1) {
		if !exported[m[1]] {
			t.Errorf("series %s without a TYPE line", m[1])
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(scrape), "\n") {
		if !strings.HasPrefix(l, "#") && !strings.Contains(l, `site="a"`) {
			t.Errorf("series without the site label: %s", l)
		}
	}

	var exprs []string
	rules, err := os.ReadFile("../dist/prometheus/mpi5k.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+expr: (.+)$`).FindAllStringSubmatch(string(rules), -1) {
		exprs = append(exprs, m[1])
	}
	b, err := os.ReadFile("../dist/prometheus/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			ID      int
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("dashboard panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	named := regexp.MustCompile(`\b(mpi5k_\w+|process_\w+)`)
	n := 0
	for _, e := range exprs {
		for _, name := range named.FindAllString(e, -1) {
			n++
			if !exported[name] {
				t.Errorf("%q names %s, which the gateway does not export", e, name)
			}
		}
	}
	if n < 15 {
		t.Errorf("only %d metric names found in the rules and the dashboard", n)
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not installed (scripts/deps.sh installs Debian's prometheus)")
		}
		t.Skip("promtool not installed: apt-get install prometheus")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
