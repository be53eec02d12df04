package npb

import (
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/testbed"
)

// bench --cross-cc/--cross-pattern reach each direction's flows; the
// report header names them, and keeps its old wording without a mix.
func TestLabExecutorCrossMix(t *testing.T) {
	e := &LabExecutor{}
	if got := e.describeCross(); got != "1 iperf3 flow(s)" {
		t.Errorf("no mix: %q", got)
	}
	e = &LabExecutor{CrossFlows: 3}
	if got := e.describeCross(); got != "3 iperf3 flow(s)" {
		t.Errorf("--cross-flows 3: %q", got)
	}
	e = &LabExecutor{CrossMix: testbed.CrossMix{CC: []string{"cubic", "bbr"}, Pattern: []string{"bulk", "onoff"}, Seed: 5}}
	if got := e.describeCross(); !strings.HasPrefix(got, "2 flow(s): cubic bulk, bbr onoff") || !strings.Contains(got, "seed 5") {
		t.Errorf("mix: %q", got)
	}
	m0, m1 := e.crossMix(90*time.Second, 0), e.crossMix(90*time.Second, 1)
	if err := m0.Normalize(); err != nil {
		t.Fatal(err)
	}
	if m0.Flows != 2 || m0.FlowCC(1) != "bbr" || m0.FlowPattern(1) != testbed.PatternOnOff || m0.Duration != 90*time.Second {
		t.Errorf("direction 0: %+v", m0)
	}
	if m0.Seed == m1.Seed || m1.Seed-m0.Seed < testbed.MaxCrossFlows {
		t.Errorf("the directions' seeds %d and %d overlap (flow i uses seed+i)", m0.Seed, m1.Seed)
	}
	e.CrossMix.Seed = 0
	if got := e.describeCross(); !strings.Contains(got, "seeds picked per run") {
		t.Errorf("mix without a seed: %q", got)
	}
	// The template is not changed by a run.
	if e.CrossMix.Flows != 0 || e.CrossMix.Duration != 0 {
		t.Errorf("template changed: %+v", e.CrossMix)
	}
}
