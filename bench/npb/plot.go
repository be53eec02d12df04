package npb

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Figure sizes: wide enough for 7 workloads x 3 modes per panel.
const (
	figW = 11 * vg.Inch
	figH = 4.2 * vg.Inch
)

// modeColor keeps a mode's colour the same in every figure.
func modeColor(i int) color.Color { return plotutil.Color(i) }

// barTitle titles a bar panel: reference, traffic, and the workloads'
// compute mode and size, so a figure of an isolating run never passes for
// a verdict.
func barTitle(h Header, ref string, cross bool) string {
	t := "time relative to " + ref + ", " + trafficTitle(cross)
	switch h.Compute {
	case "clock", "yield":
		t += "\ncompute " + h.Compute + " (isolating: gateways' CPU cost hidden)"
	case "work":
		t += ", compute work"
	}
	if h.Size != "" {
		t += ", size " + h.Size
	}
	return t
}

func trafficTitle(cross bool) string {
	if cross {
		return "with competing WAN traffic"
	}
	return "without competing traffic"
}

// DrawFigures writes bars.{png,svg} (time normalised to the reference mode)
// and, if the report has a ping-pong, pingpong.{png,svg} into dir. It
// returns the paths written.
func (r *Report) DrawFigures(dir string) ([]string, error) {
	var paths []string
	if bars, err := r.barPlots(); err != nil {
		return nil, err
	} else if len(bars) > 0 {
		p, err := saveTiled(bars, filepath.Join(dir, "bars"))
		paths = append(paths, p...)
		if err != nil {
			return paths, err
		}
	}
	if len(r.PingPong) > 0 {
		pp, err := r.pingPlots()
		if err != nil {
			return paths, err
		}
		p, err := saveTiled(pp, filepath.Join(dir, "pingpong"))
		paths = append(paths, p...)
		if err != nil {
			return paths, err
		}
	}
	return paths, nil
}

// barPlots draws one panel per traffic setting: for each workload one bar
// per mode, min time / reference mode's min time. A cell with no result
// gets no bar and an "n/a" label, never a made-up value.
func (r *Report) barPlots() ([]*plot.Plot, error) {
	var workloads []string
	crosses := map[bool]bool{}
	for _, s := range r.Summary {
		if s.Workload == "pingpong" {
			continue
		}
		if !slices.Contains(workloads, s.Workload) {
			workloads = append(workloads, s.Workload)
		}
		crosses[s.Cross] = true
	}
	if len(workloads) == 0 {
		return nil, nil
	}
	find := func(w, m string, x bool) *Summary {
		for i := range r.Summary {
			s := &r.Summary[i]
			if s.Workload == w && s.Mode == m && s.Cross == x {
				return s
			}
		}
		return nil
	}
	ref := ""
	if len(r.Modes) > 0 {
		ref = r.Modes[0].Name
	}
	// Modes that ran no pattern workload (the relay chain is a ping-pong
	// baseline) get no bars: "n/a" is for cells that failed.
	var modes []Mode
	for _, m := range r.Modes {
		for _, s := range r.Summary {
			if s.Mode == m.Name && s.Workload != "pingpong" {
				modes = append(modes, m)
				break
			}
		}
	}
	nm := len(modes)
	barW := vg.Points(60 / float64(nm+1))
	var plots []*plot.Plot
	for _, x := range []bool{false, true} {
		if !crosses[x] {
			continue
		}
		p := plot.New()
		p.Title.Text = barTitle(r.Header, ref, x)
		p.Y.Label.Text = "min time / " + ref + " min time"
		p.Y.Min = 0
		ymax := 1.2
		for i, m := range modes {
			vals := make(plotter.Values, len(workloads))
			var labels plotter.XYLabels
			for j, w := range workloads {
				s := find(w, m.Name, x)
				if s != nil && s.RatioMin != nil {
					vals[j] = *s.RatioMin
					ymax = max(ymax, vals[j])
					labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: vals[j]})
					labels.Labels = append(labels.Labels, fmt.Sprintf("%.2f", vals[j]))
				} else {
					labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: 0})
					labels.Labels = append(labels.Labels, "n/a")
				}
			}
			b, err := plotter.NewBarChart(vals, barW)
			if err != nil {
				return nil, err
			}
			b.Color = modeColor(i)
			b.LineStyle.Width = 0
			b.Offset = barW * vg.Length(float64(i)-float64(nm-1)/2)
			p.Add(b)
			p.Legend.Add(m.Name, b)
			// Value on top of each bar (or n/a where the cell failed).
			lab, err := plotter.NewLabels(labels)
			if err != nil {
				return nil, err
			}
			lab.Offset = vg.Point{X: b.Offset, Y: vg.Points(2)}
			for k := range lab.TextStyle {
				lab.TextStyle[k].Font.Size = vg.Points(7)
				lab.TextStyle[k].XAlign = draw.XCenter
			}
			p.Add(lab)
		}
		// The reference level: bars below it are faster than direct.
		one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(workloads)) - 0.5, Y: 1}})
		if err != nil {
			return nil, err
		}
		one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		one.Color = color.Gray{Y: 90}
		p.Add(one)
		p.Y.Max = ymax * 1.3 // headroom for the legend and the value labels
		p.NominalX(workloads...)
		p.Legend.Top = true
		plots = append(plots, p)
	}
	return plots, nil
}

// pingPlots draws median half-round-trip latency and bandwidth against
// message size, one curve per mode (and traffic setting).
func (r *Report) pingPlots() ([]*plot.Plot, error) {
	lat := plot.New()
	lat.Title.Text = "ping-pong latency (median half round trip)"
	lat.X.Label.Text = "message size (bytes)"
	lat.Y.Label.Text = "latency (µs)"
	lat.X.Scale, lat.Y.Scale = plot.LogScale{}, plot.LogScale{}
	lat.X.Tick.Marker, lat.Y.Tick.Marker = sizeTicks{}, decadeTicks{}
	bw := plot.New()
	bw.Title.Text = "ping-pong bandwidth"
	bw.X.Label.Text = "message size (bytes)"
	bw.Y.Label.Text = "bandwidth (MB/s)"
	bw.X.Scale = plot.LogScale{}
	bw.X.Tick.Marker = sizeTicks{}
	bw.Legend.Top, bw.Legend.Left = true, true
	lat.Legend.Top, lat.Legend.Left = true, true

	modeIdx := map[string]int{}
	for i, m := range r.Modes {
		modeIdx[m.Name] = i
	}
	type curve struct {
		mode  string
		cross bool
	}
	var order []curve
	pts := map[curve][2]plotter.XYs{}
	for _, p := range r.PingPong {
		c := curve{p.Mode, p.Cross}
		if _, ok := pts[c]; !ok {
			order = append(order, c)
		}
		v := pts[c]
		v[0] = append(v[0], plotter.XY{X: float64(p.Size), Y: p.LatMedUs})
		v[1] = append(v[1], plotter.XY{X: float64(p.Size), Y: p.BWMBps})
		pts[c] = v
	}
	for _, c := range order {
		name := c.mode
		if c.cross {
			name += " + competing"
		}
		for k, p := range []*plot.Plot{lat, bw} {
			l, s, err := plotter.NewLinePoints(pts[c][k])
			if err != nil {
				return nil, fmt.Errorf("ping-pong curve %s: %w", name, err)
			}
			l.Color = modeColor(modeIdx[c.mode])
			s.Color = l.Color
			if c.cross {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				s.Shape = draw.CrossGlyph{}
			}
			p.Add(l, s)
			p.Legend.Add(name, l, s)
		}
	}
	// Start the latency axis at a labelled power of ten.
	if len(r.PingPong) > 0 {
		lo := r.PingPong[0].LatMedUs
		for _, p := range r.PingPong {
			lo = math.Min(lo, p.LatMedUs)
		}
		if lo > 0 {
			lat.Y.Min = math.Pow(10, math.Floor(math.Log10(lo)))
		}
	}
	return []*plot.Plot{lat, bw}, nil
}

// saveTiled draws plots side by side and writes base.png and base.svg.
func saveTiled(plots []*plot.Plot, base string) ([]string, error) {
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return nil, err
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	render := func(c vg.CanvasWriterTo, path string) error {
		dc := draw.New(c)
		cv := plot.Align([][]*plot.Plot{plots}, tiles, dc)
		for i, p := range plots {
			p.Draw(cv[0][i])
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", path, err)
		}
		return f.Close()
	}
	w := figW
	if len(plots) == 1 {
		w = figW / 2
	}
	png := base + ".png"
	if err := render(vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, figH), vgimg.UseDPI(110))}, png); err != nil {
		return nil, err
	}
	svg := base + ".svg"
	if err := render(vgsvg.New(w, figH), svg); err != nil {
		return []string{png}, err
	}
	return []string{png, svg}, nil
}

// decadeTicks labels 1, 2 and 5 times each power of ten: a latency axis
// spanning less than a decade (a WAN's 10 ms .. 50 ms) still gets labels.
type decadeTicks struct{}

func (decadeTicks) Ticks(min, max float64) []plot.Tick {
	if min <= 0 || max <= min {
		return nil
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		p := math.Pow(10, e)
		for m := 1; m < 10; m++ {
			v := float64(m) * p
			if v < min || v > max {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// sizeTicks marks message sizes at powers of 4, labelled in B/KiB/MiB.
type sizeTicks struct{}

func (sizeTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for v := 1.0; v <= max*1.0001; v *= 4 {
		if v < min*0.9999 {
			continue
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: sizeLabel(v)})
	}
	return ticks
}

func sizeLabel(v float64) string {
	switch {
	case v >= 1<<20:
		return strconv.FormatFloat(v/(1<<20), 'g', -1, 64) + "Mi"
	case v >= 1<<10:
		return strconv.FormatFloat(v/(1<<10), 'g', -1, 64) + "Ki"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
