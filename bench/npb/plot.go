package npb

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
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

// palette is Okabe and Ito's colour-blind-safe set, so no two series
// differ by red against green alone; every series has a marker shape too.
var palette = []color.Color{
	color.RGBA{0x00, 0x72, 0xB2, 0xff}, // blue
	color.RGBA{0xE6, 0x9F, 0x00, 0xff}, // orange
	color.RGBA{0x00, 0x9E, 0x73, 0xff}, // bluish green
	color.RGBA{0xCC, 0x79, 0xA7, 0xff}, // reddish purple
	color.RGBA{0x56, 0xB4, 0xE9, 0xff}, // sky blue
	color.RGBA{0xD5, 0x5E, 0x00, 0xff}, // vermillion
	color.RGBA{0xF0, 0xE4, 0x42, 0xff}, // yellow
	color.RGBA{0x55, 0x55, 0x55, 0xff}, // grey
}

// modeColor keeps a mode's colour the same in every figure.
func modeColor(i int) color.Color { return palette[i%len(palette)] }

// shapes are filled and open glyphs in an order where neighbours differ
// most; modeShape keeps a series' shape the same in every figure.
var shapes = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.BoxGlyph{}, draw.PyramidGlyph{},
	draw.CrossGlyph{}, draw.RingGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.PlusGlyph{}}

func modeShape(i int) draw.GlyphDrawer { return shapes[i%len(shapes)] }

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

// nLabel says how many runs each point of a series stands for: "n=3", or
// "n=1-3" when some cells lost runs.
func nLabel(ns []int) string {
	if len(ns) == 0 {
		return "n=0"
	}
	lo, hi := slices.Min(ns), slices.Max(ns)
	if lo == hi {
		return fmt.Sprintf("n=%d", lo)
	}
	return fmt.Sprintf("n=%d-%d", lo, hi)
}

// DrawFigures writes bars.{png,svg} (time normalised to the reference mode)
// and, if the report has a ping-pong, pingpong.{png,svg} into dir. It
// returns the paths written.
func (r *Report) DrawFigures(dir string) ([]string, error) {
	var paths []string
	if bars, err := r.barPlots(); err != nil {
		return nil, err
	} else if len(bars) > 0 {
		p, err := saveTiled(bars, r.Header.FigureLine(), filepath.Join(dir, "bars"))
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
		p, err := saveTiled(pp, r.Header.FigureLine(), filepath.Join(dir, "pingpong"))
		paths = append(paths, p...)
		if err != nil {
			return paths, err
		}
	}
	return paths, nil
}

// barPlots draws one panel per traffic setting: for each workload one bar
// per mode, min time / reference mode's min time, and a mark per run (its
// time / the reference's min time) so the spread shows. A cell with no
// result gets no bar and an "n/a" label, never a made-up value.
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
	refLabel := PlainMode(r.Modes, ref)
	// Modes that ran no pattern workload (the relay chain is a ping-pong
	// baseline) get no bars: "n/a" is for cells that failed.
	var modes []int
	for i, m := range r.Modes {
		for _, s := range r.Summary {
			if s.Mode == m.Name && s.Workload != "pingpong" {
				modes = append(modes, i)
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
		p.Title.Text = barTitle(r.Header, ref, x) + "\nbars: best run; marks: every run"
		p.Y.Label.Text = "time / best " + ref + " time"
		p.Y.Tick.Marker = ratioTicks{}
		p.Y.Min = 0
		ymax := 1.2
		for k, i := range modes {
			m := r.Modes[i]
			vals := make(plotter.Values, len(workloads))
			var labels plotter.XYLabels
			var runs plotter.XYs
			var ns []int
			for j, w := range workloads {
				s := find(w, m.Name, x)
				if s != nil {
					ns = append(ns, s.N)
				}
				if s != nil && s.RatioMin != nil {
					vals[j] = *s.RatioMin
					ymax = max(ymax, vals[j])
					labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: vals[j]})
					labels.Labels = append(labels.Labels, fmt.Sprintf("%.2f", vals[j]))
				} else {
					labels.XYs = append(labels.XYs, plotter.XY{X: float64(j), Y: 0})
					labels.Labels = append(labels.Labels, "n/a")
				}
				base := find(w, ref, x)
				if base == nil || base.MinS == nil || *base.MinS <= 0 {
					continue
				}
				for _, t := range r.runTimes(w, m.Name, x) {
					runs = append(runs, plotter.XY{X: float64(j), Y: t / *base.MinS})
					ymax = max(ymax, t / *base.MinS)
				}
			}
			b, err := plotter.NewBarChart(vals, barW)
			if err != nil {
				return nil, err
			}
			b.Color = modeColor(i)
			b.LineStyle.Width = 0
			b.Offset = barW * vg.Length(float64(k)-float64(nm-1)/2)
			p.Add(b)
			thumbs := []plot.Thumbnailer{b}
			if len(runs) > 0 {
				sc, err := runMarks(p, runs, i, color.Black, b.Offset)
				if err != nil {
					return nil, err
				}
				thumbs = append(thumbs, sc)
			}
			p.Legend.Add(fmt.Sprintf("%s (%s)", ModeLabel(m), nLabel(ns)), thumbs...)
			// Value on top of each bar (or n/a where the cell failed).
			if err := barLabels(p, labels, b.Offset); err != nil {
				return nil, err
			}
		}
		// The reference level: bars below it are faster than the reference.
		one, err := refLine(len(workloads))
		if err != nil {
			return nil, err
		}
		one.Color = color.Gray{Y: 90}
		p.Add(one)
		p.Legend.Add("1 = as fast as "+refLabel+"; below: faster", one)
		p.Y.Max = ymax * (1.25 + 0.07*float64(nm)) // headroom for the legend and the value labels
		p.NominalX(workloads...)
		p.X.Label.Text = "workload"
		p.Legend.Top = true
		plots = append(plots, p)
	}
	return plots, nil
}

// runTimes are the verified runs' times of one cell.
func (r *Report) runTimes(w, mode string, cross bool) []float64 {
	var ts []float64
	for _, s := range r.Samples {
		if s.Workload == w && s.Mode == mode && s.Cross == cross && s.OK() {
			ts = append(ts, s.Result.TimeS)
		}
	}
	return ts
}

// offsetScatter draws a scatter shifted sideways by dx, onto its bar.
type offsetScatter struct {
	*plotter.Scatter
	dx vg.Length
}

func (o offsetScatter) Plot(c draw.Canvas, p *plot.Plot) {
	c.Rectangle.Min.X += o.dx
	c.Rectangle.Max.X += o.dx
	o.Scatter.Plot(c, p)
}

// pingPlots draws median half-round-trip latency and bandwidth against
// message size, one curve per mode (and traffic setting), with the
// repetitions' lowest and highest medians as error bars.
func (r *Report) pingPlots() ([]*plot.Plot, error) {
	lat := plot.New()
	lat.Title.Text = "ping-pong latency (median half round trip)\nbars: lowest to highest run's median"
	lat.X.Label.Text = "message size (bytes, log scale)"
	lat.Y.Label.Text = "latency (ms, log scale)"
	lat.X.Scale, lat.Y.Scale = plot.LogScale{}, plot.LogScale{}
	lat.X.Tick.Marker, lat.Y.Tick.Marker = sizeTicks{}, decadeTicks{}
	bw := plot.New()
	bw.Title.Text = "ping-pong bandwidth (median)\nbars: lowest to highest run's median"
	bw.X.Label.Text = "message size (bytes, log scale)"
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
	pts := map[curve][2]spreadXYs{}
	ns := map[curve][]int{}
	for _, p := range r.PingPong {
		c := curve{p.Mode, p.Cross}
		if _, ok := pts[c]; !ok {
			order = append(order, c)
		}
		v := pts[c]
		lo, hi := p.LatMedLoUs, p.LatMedHiUs
		if lo == 0 && hi == 0 { // an older report: no spread recorded
			lo, hi = p.LatMedUs, p.LatMedUs
		}
		v[0] = append(v[0], spreadXY{X: float64(p.Size), Y: p.LatMedUs / 1e3, Lo: lo / 1e3, Hi: hi / 1e3})
		lo, hi = p.BWLoMBps, p.BWHiMBps
		if lo == 0 && hi == 0 {
			lo, hi = p.BWMBps, p.BWMBps
		}
		v[1] = append(v[1], spreadXY{X: float64(p.Size), Y: p.BWMBps, Lo: lo, Hi: hi})
		pts[c] = v
		ns[c] = append(ns[c], p.N)
	}
	for k, c := range order {
		name := PlainMode(r.Modes, c.mode)
		if c.cross {
			name += ", beside competing flows"
		}
		name += " (" + nLabel(ns[c]) + ")"
		for j, p := range []*plot.Plot{lat, bw} {
			l, s, err := plotter.NewLinePoints(pts[c][j])
			if err != nil {
				return nil, fmt.Errorf("ping-pong curve %s: %w", name, err)
			}
			l.Color = modeColor(modeIdx[c.mode])
			s.Color = l.Color
			s.Shape = modeShape(k)
			s.Radius = vg.Points(3)
			if c.cross {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			}
			eb, err := plotter.NewYErrorBars(pts[c][j])
			if err != nil {
				return nil, fmt.Errorf("ping-pong curve %s: %w", name, err)
			}
			eb.Color = l.Color
			eb.CapWidth = vg.Points(4)
			p.Add(l, s, eb)
			p.Legend.Add(name, l, s)
		}
	}
	// Start the latency axis at a labelled power of ten.
	if len(r.PingPong) > 0 {
		lo := r.PingPong[0].LatMedUs
		for _, p := range r.PingPong {
			lo = math.Min(lo, p.LatMedUs)
			if p.LatMedLoUs > 0 {
				lo = math.Min(lo, p.LatMedLoUs)
			}
		}
		if lo > 0 {
			lat.Y.Min = math.Pow(10, math.Floor(math.Log10(lo/1e3)))
		}
	}
	return []*plot.Plot{lat, bw}, nil
}

// spreadXY is a point with the range its repetitions spanned.
type spreadXY struct{ X, Y, Lo, Hi float64 }

// spreadXYs is a curve with error bars (plotter.XYer and YErrorer).
type spreadXYs []spreadXY

func (s spreadXYs) Len() int                    { return len(s) }
func (s spreadXYs) XY(i int) (float64, float64) { return s[i].X, s[i].Y }
func (s spreadXYs) YError(i int) (float64, float64) {
	return max(0, s[i].Y-s[i].Lo), max(0, s[i].Hi-s[i].Y)
}

// saveTiled draws plots side by side under heading (the set-up, once for
// the whole figure) and writes base.png and base.svg.
func saveTiled(plots []*plot.Plot, heading, base string) ([]string, error) {
	if err := os.MkdirAll(filepath.Dir(base), 0o755); err != nil {
		return nil, err
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	render := func(c vg.CanvasWriterTo, path string) error {
		dc := draw.New(c)
		if heading != "" {
			sty := plot.New().Title.TextStyle
			sty.Font.Size = vg.Points(11)
			sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
			text := wrapHeading(heading, func(s string) vg.Length { return sty.Width(s) }, dc.Max.X-dc.Min.X-vg.Millimeter*4)
			top := dc.Max.Y - vg.Millimeter*2
			dc.FillText(sty, vg.Point{X: dc.Center().X, Y: top}, text)
			dc.Max.Y = top - sty.Height(text) - vg.Millimeter*2
		}
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

// ratioTicks labels a ratio axis at steps of 0.25, 0.5 or 1 (by its
// range), with minor ticks between: gonum's defaults labelled only two.
type ratioTicks struct{}

func (ratioTicks) Ticks(min, max float64) []plot.Tick {
	step := 0.25
	switch {
	case max-min > 8:
		step = 2
	case max-min > 4:
		step = 1
	case max-min > 2:
		step = 0.5
	}
	var ticks []plot.Tick
	for i := math.Ceil(min / step * 2); i*step/2 <= max; i++ {
		v := i * step / 2
		t := plot.Tick{Value: v}
		if int(i)%2 == 0 {
			t.Label = strconv.FormatFloat(v, 'f', -1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// wrapHeading breaks a heading at its "; " into lines no wider than w
// (as width measures them), so a one-panel figure keeps all of it.
func wrapHeading(h string, width func(string) vg.Length, w vg.Length) string {
	var lines []string
	cur := ""
	for _, part := range strings.Split(h, "; ") {
		switch {
		case cur == "":
			cur = part
		case width(cur+"; "+part) <= w:
			cur += "; " + part
		default:
			lines = append(lines, cur+";")
			cur = part
		}
	}
	return strings.Join(append(lines, cur), "\n")
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

// runMarks marks each run (xys) on p with mode i's shape in c, beside the
// bars at offset off, and returns the marks for the legend.
func runMarks(p *plot.Plot, xys plotter.XYs, i int, c color.Color, off vg.Length) (*plotter.Scatter, error) {
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return nil, err
	}
	sc.GlyphStyleFunc = nil
	sc.GlyphStyle = draw.GlyphStyle{Shape: modeShape(i), Color: c, Radius: vg.Points(2.5)}
	p.Add(offsetScatter{sc, off})
	return sc, nil
}

// barLabels writes each label above its bar, bars at offset off.
func barLabels(p *plot.Plot, labels plotter.XYLabels, off vg.Length) error {
	lab, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	lab.Offset = vg.Point{X: off, Y: vg.Points(5)}
	for k := range lab.TextStyle {
		lab.TextStyle[k].Font.Size = vg.Points(7)
		lab.TextStyle[k].XAlign = draw.XCenter
	}
	p.Add(lab)
	return nil
}

// refLine is the dashed level 1 across n bar groups: a ratio below it is
// faster than the reference.
func refLine(n int) (*plotter.Line, error) {
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(n) - 0.5, Y: 1}})
	if err != nil {
		return nil, err
	}
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	return one, nil
}
