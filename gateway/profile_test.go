package gateway

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCPUProfile: --cpu-profile DIR writes the gateway's CPU profile to
// DIR/cpu-<site>-<pid>.pprof when Run ends (gzip, as go tool pprof reads
// it); a directory that does not exist fails Run, naming the flag.
func TestCPUProfile(t *testing.T) {
	dir := t.TempDir()
	m := testMap(t)
	a := startGW(t, m, "a", func(c *Config) { c.CPUProfile = dir })
	startGW(t, m, "b", nil) // one process profiles one gateway
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("mesh did not come up")
	}
	name := filepath.Join(dir, fmt.Sprintf("cpu-a-%d.pprof", os.Getpid()))
	a.stop()
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("gateway did not stop")
	}
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Fatalf("%s: %d bytes, not a gzipped profile", name, len(b))
	}

	cfg, err := testConfig(m, "a")
	if err != nil {
		t.Fatal(err)
	}
	cfg.CPUProfile = filepath.Join(dir, "missing")
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Run(ctx); err == nil || !strings.Contains(err.Error(), "--cpu-profile") {
		t.Fatalf("Run with a missing profile directory: %v, want an error naming --cpu-profile", err)
	}
}
