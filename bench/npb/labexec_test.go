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

// The header names competing flows only when the plan runs beside them:
// the demo's idle runs once announced a flow they never started.
func TestDescribeLabCross(t *testing.T) {
	c := testbed.Config{Nodes: 2, RTT: 20 * time.Millisecond, WANRate: 200e6, HostCC: "cubic", CrossMTU: 9000}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	none := describeLab("x", c, "1 iperf3 flow(s)", []bool{false})
	if strings.Contains(none, "iperf3") || strings.Contains(none, "9000") || !strings.Contains(none, "no competing traffic") {
		t.Errorf("without competing runs: %q", none)
	}
	with := describeLab("x", c, "1 iperf3 flow(s)", []bool{true})
	if !strings.Contains(with, "competing traffic 1 iperf3 flow(s) per direction in 9000-byte frames") || strings.Contains(with, "marked") {
		t.Errorf("beside competing flows: %q", with)
	}
	both := describeLab("x", c, "1 iperf3 flow(s)", []bool{false, true})
	if !strings.Contains(both, "in the runs marked cross") {
		t.Errorf("both: %q", both)
	}
	if got := SetupOf(c); got != "RTT 20ms, WAN 200 Mbit/s, loss 0 %, hosts' TCP cubic" {
		t.Errorf("setup %q", got)
	}
	c.Loss = 0.001
	if got := SetupOf(c); !strings.Contains(got, "loss 0.1 %") {
		t.Errorf("setup %q", got)
	}
}
