package trace

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// BusiestConn returns the WAN connection that wrote the most bytes, or the
// busiest connection of any scope when there is no WAN traffic.
func BusiestConn(t *Trace) *Conn {
	var best, bestWAN *Conn
	var bb, bw int64 = -1, -1
	for _, c := range t.Conns {
		var n int64
		for _, w := range c.Writes {
			n += w.Size
		}
		if n > bb {
			best, bb = c, n
		}
		if c.Scope() == ScopeWAN && n > bw {
			bestWAN, bw = c, n
		}
	}
	if bestWAN != nil && bw > 0 {
		return bestWAN
	}
	return best
}

// FindConn returns the connection with the given id (Conn.ID).
func FindConn(t *Trace, id string) (*Conn, error) {
	var ids []string
	for _, c := range t.Conns {
		if c.ID == id {
			return c, nil
		}
		if len(c.Writes) > 0 {
			ids = append(ids, c.ID)
		}
	}
	if len(ids) > 8 {
		ids = append(ids[:8], "...")
	}
	return nil, fmt.Errorf("no connection %q in the trace (connections with writes: %s; see `mpi5k trace report`)", id, strings.Join(ids, ", "))
}

var (
	colWrite    = color.RGBA{R: 30, G: 30, B: 30, A: 255}
	colCwnd     = color.RGBA{R: 0, G: 90, B: 200, A: 255}
	colInflight = color.RGBA{R: 230, G: 120, B: 0, A: 255}
	colRetrans  = color.RGBA{R: 220, G: 0, B: 0, A: 255}
	colIdle     = color.RGBA{R: 0, G: 150, B: 60, A: 255}
)

// Timeline draws c's write sizes over time (top) and, on the same time
// axis, its congestion window and bytes in flight from the TCP_INFO
// samples (bottom), with retransmissions, RTOs and idle restarts marked.
// format is "png" or "svg".
func Timeline(w io.Writer, c *Conn, format string) error {
	if len(c.Writes) == 0 && len(c.Samples) == 0 {
		return fmt.Errorf("connection %s has neither writes nor TCP_INFO samples: nothing to draw", c.ID)
	}
	t0 := int64(math.MaxInt64)
	if len(c.Writes) > 0 {
		t0 = c.Writes[0].T
	}
	if len(c.Samples) > 0 {
		t0 = min(t0, c.Samples[0].T)
	}
	sec := func(t int64) float64 { return float64(t-t0) / 1e9 }

	top := plot.New()
	top.Title.Text = fmt.Sprintf("%s  %s -> %s (%s, %s)", c.ID, ap(c.Local), ap(c.Peer), c.PeerHost, c.Scope())
	top.Y.Label.Text = "write size (bytes)"
	top.Y.Scale = plot.LogScale{}
	top.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	top.Add(plotter.NewGrid())
	var xmax float64
	if len(c.Writes) > 0 {
		pts := make(plotter.XYs, len(c.Writes))
		for i, wr := range c.Writes {
			pts[i] = plotter.XY{X: sec(wr.T), Y: float64(max(wr.Size, 1))}
			xmax = max(xmax, pts[i].X)
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = colWrite
		sc.GlyphStyle.Radius = vg.Points(1.5)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		top.Add(sc)
		top.Legend.Add(fmt.Sprintf("writes (%d, %s)", len(c.Writes), FormatBytes(sumWrites(c.Writes))), sc)
	} else {
		top.Title.Text += "  [no writes]"
	}
	top.Legend.Top = true

	bot := plot.New()
	bot.X.Label.Text = "time (s)"
	bot.Y.Label.Text = "bytes"
	bot.Add(plotter.NewGrid())
	if len(c.Samples) > 0 {
		cw := make(plotter.XYs, 0, 2*len(c.Samples))
		fl := make(plotter.XYs, 0, 2*len(c.Samples))
		var retr, idle plotter.XYs
		for i, s := range c.Samples {
			x := sec(s.T)
			xmax = max(xmax, x)
			// Steps: a sample's value holds until the next one.
			if i > 0 {
				cw = append(cw, plotter.XY{X: x, Y: cw[len(cw)-1].Y})
				fl = append(fl, plotter.XY{X: x, Y: fl[len(fl)-1].Y})
				p := c.Samples[i-1]
				if s.TotalRetrans > p.TotalRetrans || s.RTOs > p.RTOs {
					retr = append(retr, plotter.XY{X: x, Y: float64(s.CwndBytes())})
				}
				if s.IdleRestarts > p.IdleRestarts {
					idle = append(idle, plotter.XY{X: x, Y: float64(s.CwndBytes())})
				}
			}
			cw = append(cw, plotter.XY{X: x, Y: float64(s.CwndBytes())})
			fl = append(fl, plotter.XY{X: x, Y: float64(s.InFlight())})
		}
		lc, err := plotter.NewLine(cw)
		if err != nil {
			return err
		}
		lc.Color, lc.Width = colCwnd, vg.Points(1.2)
		lf, err := plotter.NewLine(fl)
		if err != nil {
			return err
		}
		lf.Color, lf.Width = colInflight, vg.Points(1)
		bot.Add(lc, lf)
		bot.Legend.Add("cwnd x MSS", lc)
		bot.Legend.Add("bytes in flight", lf)
		for _, m := range []struct {
			pts   plotter.XYs
			col   color.Color
			shape draw.GlyphDrawer
			name  string
		}{{retr, colRetrans, draw.CrossGlyph{}, "retransmission/RTO"}, {idle, colIdle, draw.TriangleGlyph{}, "idle restart"}} {
			if len(m.pts) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(m.pts)
			if err != nil {
				return err
			}
			sc.GlyphStyle.Color, sc.GlyphStyle.Shape, sc.GlyphStyle.Radius = m.col, m.shape, vg.Points(4)
			bot.Add(sc)
			bot.Legend.Add(fmt.Sprintf("%s (%d)", m.name, len(m.pts)), sc)
		}
		l := c.Samples[len(c.Samples)-1]
		bot.Title.Text = fmt.Sprintf("TCP_INFO: %d samples, %d retransmits (%d fast, %d rto), %d RTOs, %d idle restarts",
			len(c.Samples), l.TotalRetrans, l.RetransFast, l.RetransRTO, l.RTOs, l.IdleRestarts)
	} else {
		bot.Title.Text = "no TCP_INFO samples for this connection (shim without sampling, or MPI5K_TRACE_SAMPLE=0)"
		bot.Y.Min, bot.Y.Max = 0, 1
	}
	bot.Legend.Top = true
	for _, p := range []*plot.Plot{top, bot} {
		p.X.Min, p.X.Max = 0, max(xmax, 1e-3)*1.02
	}

	width, height := 28*vg.Centimeter, 18*vg.Centimeter
	var cv vg.CanvasWriterTo
	switch format {
	case "png":
		cv = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))}
	case "svg":
		cv = vgsvg.New(width, height)
	default:
		return fmt.Errorf("timeline format %q: want png or svg", format)
	}
	dc := draw.New(cv)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	plots := [][]*plot.Plot{{top}, {bot}}
	cs := plot.Align(plots, tiles, dc)
	top.Draw(cs[0][0])
	bot.Draw(cs[1][0])
	_, err := cv.WriteTo(w)
	return err
}

func sumWrites(ws []Write) int64 {
	var n int64
	for _, w := range ws {
		n += w.Size
	}
	return n
}
