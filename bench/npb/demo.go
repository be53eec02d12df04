package npb

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Condition is one state of the WAN the demo runs the workloads on.
type Condition struct {
	Name  string  `json:"name"`  // short: idle, lossy, shared (directories, JSON)
	Label string  `json:"label"` // plain words for the table and the figure
	Loss  float64 `json:"loss,omitempty"`
	// Cross runs the workloads beside competing flows (one per direction).
	Cross bool `json:"cross,omitempty"`
}

// DemoConditions are what `make demo` compares: the gateways matter least
// on an idle WAN and most on a lossy or shared one, so a user sees all
// three.
var DemoConditions = []Condition{
	{Name: "idle", Label: "idle WAN"},
	{Name: "lossy", Label: "0.1 % random loss", Loss: 0.001},
	{Name: "shared", Label: "one CUBIC flow each way", Cross: true},
}

// blackish marks single runs on top of coloured bars.
var blackish = color.Gray{Y: 20}

// Demo is the reports of one run per condition; it is also demo.json.
type Demo struct {
	Conditions []Condition `json:"conditions"`
	Reports    []*Report   `json:"reports"` // one per condition, same order
}

// ReadDemo loads a demo.json written by WriteFile.
func ReadDemo(path string) (*Demo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d Demo
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(d.Conditions) == 0 || len(d.Conditions) != len(d.Reports) {
		return nil, fmt.Errorf("%s: %d conditions and %d reports: not a demo.json of mpi5k bench --demo", path, len(d.Conditions), len(d.Reports))
	}
	return &d, nil
}

// WriteFile writes dir/demo.json and returns its path.
func (d *Demo) WriteFile(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "demo.json")
	return p, os.WriteFile(p, append(b, '\n'), 0o644)
}

// Failed reports whether any cell of any condition lost a run.
func (d *Demo) Failed() bool {
	for _, r := range d.Reports {
		for _, s := range r.Summary {
			if s.Failed > 0 {
				return true
			}
		}
	}
	return false
}

// demoCell is what the table and the figure show of one workload under one
// condition: the gateway mode's time over the reference's, and the
// gateways' CPU.
type demoCell struct {
	ratio    *float64  // best gateway time / best reference time
	runs     []float64 // each gateway run's time / best reference time
	refS     *float64  // best reference time
	cpuS     *float64  // the gateways' CPU seconds, median over the runs
	share    *float64  // cpuS / (median time x cores): the machine's CPU they took
	n, nRef  int
	failures []string
}

// gatewayMode is the first gateway mode of r: the one the demo compares.
func (r *Report) gatewayMode() (Mode, bool) {
	for _, m := range r.Modes {
		if m.Kind == KindGateways {
			return m, true
		}
	}
	return Mode{}, false
}

func (d *Demo) cell(i int, w string) demoCell {
	r := d.Reports[i]
	var c demoCell
	gm, ok := r.gatewayMode()
	if !ok || len(r.Modes) == 0 {
		return c
	}
	ref := r.Modes[0].Name
	for _, s := range r.Summary {
		if s.Workload != w {
			continue
		}
		switch s.Mode {
		case ref:
			c.refS, c.nRef = s.MinS, s.N
		case gm.Name:
			c.ratio, c.cpuS, c.n = s.RatioMin, s.GatewayCPUS, s.N
			if c.cpuS != nil && s.MedianS != nil && *s.MedianS > 0 && r.Header.Cores > 0 {
				c.share = ptr(*c.cpuS / (*s.MedianS * float64(r.Header.Cores)))
			}
		default:
			continue
		}
		for _, e := range s.Errors {
			c.failures = append(c.failures, ModeLabel(r.modeNamed(s.Mode))+": "+e)
		}
	}
	if c.refS != nil && *c.refS > 0 {
		for _, t := range r.runTimes(w, gm.Name, d.Conditions[i].Cross) {
			c.runs = append(c.runs, t / *c.refS)
		}
	}
	return c
}

func (r *Report) modeNamed(name string) Mode {
	for _, m := range r.Modes {
		if m.Name == name {
			return m
		}
	}
	return Mode{Name: name}
}

// workloads lists the pattern workloads of every condition, in run order.
func (d *Demo) workloads() []string {
	var ws []string
	for _, r := range d.Reports {
		for _, s := range r.Summary {
			if s.Workload != "pingpong" && !slices.Contains(ws, s.Workload) {
				ws = append(ws, s.Workload)
			}
		}
	}
	return ws
}

// WriteTable prints what the demo ran, then one row per workload with a
// column group per condition: direct's time, the time through the
// gateways over direct's, and the gateways' CPU.
func (d *Demo) WriteTable(w io.Writer) {
	if len(d.Reports) == 0 {
		return
	}
	h := d.Reports[0].Header
	fmt.Fprintf(w, "# %s  mpi=%s  ranks=%d on %d cores  size=%s  scale=%g  %d run(s) per mode and condition  commit %s\n",
		h.Date, h.MPI, h.Ranks, h.Cores, orSmall(h.Size), h.Scale, h.Reps, h.CommitLabel())
	for i, c := range d.Conditions {
		fmt.Fprintf(w, "# %-24s %s\n", c.Label+":", d.Reports[i].Header.Lab)
	}
	fmt.Fprintf(w, "# direct: the ranks' own TCP over the WAN; gw/direct: best time through the gateways / best direct time (below 1: the gateways are faster);\n"+
		"# gw CPU: the gateways' CPU seconds (user+system, both sites) during the job, and that as a share of the %d cores over the timed run\n", h.Cores)
	const group = 27
	fmt.Fprintf(w, "%-9s", "")
	for _, c := range d.Conditions {
		fmt.Fprintf(w, " | %-*s", group, center(c.Label, group))
	}
	fmt.Fprintf(w, "\n%-9s", "workload")
	for range d.Conditions {
		fmt.Fprintf(w, " | %8s %8s %9s", "direct_s", "gw/direct", "gw CPU")
	}
	fmt.Fprintln(w)
	var failures []string
	for _, wl := range d.workloads() {
		fmt.Fprintf(w, "%-9s", wl)
		for i, cond := range d.Conditions {
			c := d.cell(i, wl)
			cpu := "-"
			if c.cpuS != nil {
				cpu = strconv.FormatFloat(*c.cpuS, 'f', 2, 64) + "s"
				if c.share != nil {
					cpu += fmt.Sprintf(" %2.0f%%", *c.share*100)
				}
			}
			ratio := dashF(c.ratio, 2)
			if c.ratio == nil && len(c.failures) > 0 {
				ratio = "FAILED"
			}
			fmt.Fprintf(w, " | %8s %9s %9s", dashF(c.refS, 2), ratio, cpu)
			for _, f := range c.failures {
				failures = append(failures, fmt.Sprintf("%s, %s, %s", wl, cond.Label, f))
			}
		}
		fmt.Fprintln(w)
	}
	if n := d.reruns(); n > 0 {
		fmt.Fprintf(w, "# %d run(s) ran again after a lab stall (the machine starved the WAN emulator of CPU: that first run was no measurement)\n", n)
	}
	for _, f := range failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
}

// reruns counts the runs that ran again after a lab stall.
func (d *Demo) reruns() int {
	n := 0
	for _, r := range d.Reports {
		for _, s := range r.Samples {
			if strings.Contains(s.Note, RerunNote) {
				n++
			}
		}
	}
	return n
}

func orSmall(s string) string {
	if s == "" {
		return "small"
	}
	return s
}

func dashF(p *float64, prec int) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(*p, 'f', prec, 64)
}

func center(s string, w int) string {
	if len(s) >= w {
		return s
	}
	pad := (w - len(s)) / 2
	return strings.Repeat(" ", pad) + s
}

// DrawFigure writes demo.{png,svg} into dir: per workload one bar per
// condition (time through the gateways / direct's, a mark per run), and
// beside it the gateways' CPU share per condition. It returns the paths.
func (d *Demo) DrawFigure(dir string) ([]string, error) {
	ws := d.workloads()
	if len(ws) == 0 {
		return nil, nil
	}
	h := d.Reports[0].Header
	ratio := plot.New()
	ratio.Title.Text = "time through the gateways / direct time\nbars: best run; marks: every run; below 1: the gateways are faster"
	ratio.Y.Label.Text = "best time through the gateways / best direct time"
	ratio.X.Label.Text = "workload"
	ratio.Y.Tick.Marker = ratioTicks{}
	cpu := plot.New()
	cpu.Title.Text = fmt.Sprintf("the gateways' CPU during the job\nshare of the machine's %d cores over the timed run", h.Cores)
	cpu.Y.Label.Text = "gateways' CPU (% of all cores)"
	cpu.X.Label.Text = "workload"
	nc := len(d.Conditions)
	barW := vg.Points(48 / float64(nc))
	ymax, cmax := 1.2, 5.0
	for i, cond := range d.Conditions {
		vals := make(plotter.Values, len(ws))
		shares := make(plotter.Values, len(ws))
		var runs plotter.XYs
		var labels, cpuLabels plotter.XYLabels
		var ns []int
		for j, wl := range ws {
			c := d.cell(i, wl)
			ns = append(ns, c.n)
			lab := "n/a"
			if c.ratio != nil {
				vals[j] = *c.ratio
				ymax = max(ymax, vals[j])
				lab = fmt.Sprintf("%.2f", vals[j])
			}
			labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: vals[j]})
			labels.Labels = append(labels.Labels, lab)
			for _, v := range c.runs {
				runs = append(runs, plotter.XY{X: float64(j), Y: v})
				ymax = max(ymax, v)
			}
			lab = "n/a"
			if c.share != nil {
				shares[j] = *c.share * 100
				cmax = max(cmax, shares[j])
				lab = fmt.Sprintf("%.0f", shares[j])
			}
			cpuLabels.XYs = append(cpuLabels.XYs, plotter.XY{X: float64(j), Y: shares[j]})
			cpuLabels.Labels = append(cpuLabels.Labels, lab)
		}
		name := fmt.Sprintf("%s (%s)", cond.Label, nLabel(ns))
		off := barW * vg.Length(float64(i)-float64(nc-1)/2)
		for k, p := range []*plot.Plot{ratio, cpu} {
			v, l := vals, labels
			if k == 1 {
				v, l = shares, cpuLabels
			}
			b, err := plotter.NewBarChart(v, barW)
			if err != nil {
				return nil, err
			}
			b.Color = modeColor(i)
			b.LineStyle.Width = 0
			b.Offset = off
			p.Add(b)
			thumbs := []plot.Thumbnailer{b}
			if k == 0 && len(runs) > 0 {
				sc, err := runMarks(p, runs, i, blackish, off)
				if err != nil {
					return nil, err
				}
				thumbs = append(thumbs, sc)
			} else {
				// The same shape on the CPU bars' tops, so the panels
				// tell the conditions apart without colour too.
				var tops plotter.XYs
				for j := range v {
					if l.Labels[j] != "n/a" {
						tops = append(tops, plotter.XY{X: float64(j), Y: v[j]})
					}
				}
				if len(tops) > 0 {
					sc, err := runMarks(p, tops, i, blackish, off)
					if err != nil {
						return nil, err
					}
					thumbs = append(thumbs, sc)
				}
			}
			p.Legend.Add(name, thumbs...)
			if err := barLabels(p, l, off); err != nil {
				return nil, err
			}
		}
	}
	one, err := refLine(len(ws))
	if err != nil {
		return nil, err
	}
	ratio.Add(one)
	ratio.Legend.Add("1 = as fast as direct", one)
	for _, p := range []*plot.Plot{ratio, cpu} {
		p.NominalX(ws...)
		p.Legend.Top = true
		p.Y.Min = 0
	}
	ratio.Y.Max = ymax * 1.45
	cpu.Y.Max = cmax * 1.45
	heading := "make demo: " + d.setup() + "; commit " + h.CommitLabel()
	if len(h.Date) >= 10 {
		heading += ", " + h.Date[:10]
	}
	return saveTiled([]*plot.Plot{ratio, cpu}, heading, filepath.Join(dir, "demo"))
}

// setup is the set-up common to the conditions (the first one's, whose
// loss is 0 and says nothing) with the machine.
func (d *Demo) setup() string {
	h := d.Reports[0].Header
	s := h.SetupLine()
	if i := strings.Index(s, ", loss "); i >= 0 {
		rest := s[i+2:]
		s = s[:i]
		if j := strings.Index(rest, ", "); j >= 0 {
			s += rest[j:]
		}
	}
	return fmt.Sprintf("%s; %d ranks on %d cores, size %s, scale %g", s, h.Ranks, h.Cores, orSmall(h.Size), h.Scale)
}
