package wrap

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestConfigDefaults: zero settings take DefaultConfig's, which Validate
// accepts; Run refuses a setting out of range by name.
func TestConfigDefaults(t *testing.T) {
	var c Config
	c.fillDefaults()
	d := DefaultConfig()
	if c.Stdout != d.Stdout || c.Stderr != d.Stderr || c.Getenv == nil || strings.Join(c.Launcher, " ") != "ssh" ||
		c.ReadyTimeout != d.ReadyTimeout || c.Outage != GatewayOutage || c.StartWhen != DefaultStartWhen {
		t.Errorf("zero Config filled: %+v, want DefaultConfig's settings", c)
	}
	d.Argv = []string{"mpirun", "./app"}
	if err := d.Validate(); err != nil {
		t.Error(err)
	}
	var out strings.Builder
	for field, bad := range map[string]Config{
		"ReadyTimeout": {ReadyTimeout: -time.Second},
		"WANPort":      {WANPort: 70000},
		"--start-when": {StartWhen: "soon"},
	} {
		bad.Argv, bad.Stdout, bad.Stderr = []string{"mpirun", "./app"}, &out, &out
		if code, err := Run(context.Background(), bad); code != 2 || err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: status %d, %v", field, code, err)
		}
	}
}
