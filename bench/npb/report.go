package npb

import (
	"cmp"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Header says what produced a report, so a figure is never read without
// the machine's limits and the emulated WAN beside it.
type Header struct {
	Date         string  `json:"date"`
	Version      string  `json:"version,omitempty"`
	Cores        int     `json:"cores"`
	Ranks        int     `json:"ranks"`
	RanksPerCore float64 `json:"ranks_per_core"`
	MPI          string  `json:"mpi"`
	Lab          string  `json:"lab"` // emulated WAN settings, free text
	Scale        float64 `json:"scale"`
	Reps         int     `json:"reps"`
	// Size and Compute are the workloads' --size and --compute ("" in
	// reports written before they were recorded).
	Size    string `json:"size,omitempty"`
	Compute string `json:"compute,omitempty"`
	// Commit is the source commit of the mpi5k that ran; Setup the WAN in
	// a few words (RTT, rate, loss, hosts' TCP), for figure titles. Both
	// are "" in older reports: SetupLine and CommitLabel then read them
	// out of Lab and Version.
	Commit string `json:"commit,omitempty"`
	Setup  string `json:"setup,omitempty"`
}

var (
	labRTT     = regexp.MustCompile(`RTT (\S+?),`)
	labWAN     = regexp.MustCompile(`WAN (.+?) per direction`)
	labLoss    = regexp.MustCompile(`loss ([^,]+),`)
	labHostTCP = regexp.MustCompile(`host TCP ([^,]+)`)
)

// SetupLine is the WAN of the report in a few words: Setup, or for an
// older report the same read out of its lab line.
func (h Header) SetupLine() string {
	if h.Setup != "" {
		return h.Setup
	}
	var parts []string
	if m := labRTT.FindStringSubmatch(h.Lab); m != nil {
		parts = append(parts, "RTT "+m[1])
	}
	if m := labWAN.FindStringSubmatch(h.Lab); m != nil {
		parts = append(parts, "WAN "+m[1])
	}
	if m := labLoss.FindStringSubmatch(h.Lab); m != nil {
		parts = append(parts, "loss "+LossWords(m[1]))
	}
	if m := labHostTCP.FindStringSubmatch(h.Lab); m != nil {
		parts = append(parts, "hosts' TCP "+m[1])
	}
	if len(parts) == 0 {
		return "set-up not recorded"
	}
	return strings.Join(parts, ", ")
}

// LossWords writes a loss probability ("0.001") as a percentage ("0.1 %").
func LossWords(p string) string {
	f, err := strconv.ParseFloat(p, 64)
	if err != nil {
		return p
	}
	return strconv.FormatFloat(f*100, 'g', 3, 64) + " %"
}

// CommitLabel names the commit that produced the report: Commit, else the
// commit in Version (v1.2.0-dev+abc123 or a bare hash), else "unknown".
func (h Header) CommitLabel() string {
	switch {
	case h.Commit != "":
		return h.Commit
	case strings.Contains(h.Version, "+"):
		return h.Version[strings.LastIndex(h.Version, "+")+1:]
	case h.Version != "":
		return h.Version
	}
	return "unknown"
}

// FigureLine is the second title line of every figure: set-up, machine,
// commit and day, so a figure cut out of its report still says what made it.
func (h Header) FigureLine() string {
	s := h.SetupLine()
	if h.Ranks > 0 && h.Cores > 0 {
		s += fmt.Sprintf("; %d ranks on %d cores", h.Ranks, h.Cores)
	}
	s += "; commit " + h.CommitLabel()
	if len(h.Date) >= 10 {
		s += ", " + h.Date[:10]
	}
	return s
}

// ComputeNote says what a compute mode's times mean, for the report's
// header: only work measures what the gateways cost the ranks.
func ComputeNote(mode string) string {
	switch mode {
	case "work":
		return "compute work: real arithmetic at a pinned rate; CPU the gateways take shows in the times (the verdict)"
	case "clock", "yield":
		return "compute " + mode + ": ISOLATING TOOL, not a verdict: the gaps spin on the clock, so CPU the gateways take from the ranks does not show in these times"
	}
	return "compute " + mode
}

// Report is everything a run produced; it is also the JSON file.
type Report struct {
	Header   Header        `json:"header"`
	Modes    []Mode        `json:"modes"`
	Samples  []Sample      `json:"samples"`
	Summary  []Summary     `json:"summary"`
	PingPong []PingSummary `json:"pingpong,omitempty"`
}

// NewReport aggregates samples; modes[0] is the ratio reference.
func NewReport(h Header, modes []Mode, samples []Sample) *Report {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.Name
	}
	ref := ""
	if len(names) > 0 {
		ref = names[0]
	}
	return &Report{Header: h, Modes: modes, Samples: samples,
		Summary: Summarize(samples, names, ref), PingPong: SummarizePing(samples)}
}

// ReadReport loads a report written by WriteFiles (to redraw figures).
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func fmtOpt(p *float64, prec int) string {
	if p == nil {
		return ""
	}
	return strconv.FormatFloat(*p, 'f', prec, 64)
}

// WriteFiles writes results.json, summary.csv, samples.csv and (if there
// was a ping-pong) pingpong.csv into dir; it returns the paths written.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	write := func(name string, fn func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	}
	if err := write("results.json", func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}); err != nil {
		return paths, err
	}
	if err := write("summary.csv", r.writeSummaryCSV); err != nil {
		return paths, err
	}
	if err := write("samples.csv", r.writeSamplesCSV); err != nil {
		return paths, err
	}
	if len(r.PingPong) > 0 {
		if err := write("pingpong.csv", r.writePingCSV); err != nil {
			return paths, err
		}
	}
	return paths, nil
}

func (r *Report) writeSummaryCSV(w io.Writer) error {
	c := csv.NewWriter(w)
	_ = c.Write([]string{"workload", "mode", "cross", "n", "failed", "min_s", "median_s",
		"ratio_min", "ratio_median", "gw_cpu_s", "gw_cpu_s_per_gib", "competing_mbit_s",
		"job_mbit_s", "gw_cpu_us_per_msg", "added_us_per_msg", "status"})
	for _, s := range r.Summary {
		status := "ok"
		if s.N == 0 {
			status = "FAILED: " + strings.Join(s.Errors, "; ")
		} else if s.Failed > 0 {
			status = fmt.Sprintf("%d failed: %s", s.Failed, strings.Join(s.Errors, "; "))
		}
		_ = c.Write([]string{s.Workload, s.Mode, strconv.FormatBool(s.Cross), strconv.Itoa(s.N),
			strconv.Itoa(s.Failed), fmtOpt(s.MinS, 6), fmtOpt(s.MedianS, 6),
			fmtOpt(s.RatioMin, 4), fmtOpt(s.RatioMedian, 4), fmtOpt(s.GatewayCPUS, 3), fmtOpt(s.GatewayCPUPerGiB, 3), fmtOpt(s.CompetingMbit, 1),
			fmtOpt(s.JobMbit, 1), fmtOpt(s.GatewayCPUPerMsgUs, 2), fmtOpt(s.AddedUsPerMsg, 1), status})
	}
	c.Flush()
	return c.Error()
}

func (r *Report) writeSamplesCSV(w io.Writer) error {
	c := csv.NewWriter(w)
	_ = c.Write([]string{"rep", "workload", "mode", "cross", "time_s", "compute_s", "bytes",
		"wan_bytes", "msgs", "wan_msgs", "mpi", "ranks", "gw_cpu_s", "gw_wan_bytes", "gw_renewals", "gw_yields", "cross_mbit_s", "error", "note"})
	for _, s := range r.Samples {
		row := []string{strconv.Itoa(s.Rep + 1), s.Workload, s.Mode, strconv.FormatBool(s.Cross)}
		if res := s.Result; res != nil && s.OK() {
			row = append(row, strconv.FormatFloat(res.TimeS, 'f', 6, 64),
				strconv.FormatFloat(res.ComputeS, 'f', 6, 64),
				strconv.FormatUint(res.Bytes, 10), strconv.FormatUint(res.WANBytes, 10),
				strconv.FormatUint(res.Msgs, 10), strconv.FormatUint(res.WANMsgs, 10),
				res.MPI, strconv.Itoa(res.Ranks))
		} else {
			row = append(row, "", "", "", "", "", "", "", "")
		}
		if cpu, wan, ok := s.gatewayCPU(); ok {
			r, y := s.expressEvents()
			row = append(row, strconv.FormatFloat(cpu, 'f', 3, 64), strconv.FormatUint(wan, 10),
				strconv.FormatUint(r, 10), strconv.FormatUint(y, 10))
		} else {
			row = append(row, "", "", "", "")
		}
		cross := ""
		if s.Competing != nil {
			cross = strconv.FormatFloat(s.Competing.Mbit(), 'f', 1, 64)
		}
		row = append(row, cross, s.Err, s.Note)
		_ = c.Write(row)
	}
	c.Flush()
	return c.Error()
}

func (r *Report) writePingCSV(w io.Writer) error {
	c := csv.NewWriter(w)
	_ = c.Write([]string{"mode", "cross", "size", "n", "lat_us_min", "lat_us_med", "bw_MBps"})
	for _, p := range r.PingPong {
		_ = c.Write([]string{p.Mode, strconv.FormatBool(p.Cross), strconv.Itoa(p.Size),
			strconv.Itoa(p.N), strconv.FormatFloat(p.LatMinUs, 'f', 3, 64),
			strconv.FormatFloat(p.LatMedUs, 'f', 3, 64), strconv.FormatFloat(p.BWMBps, 'f', 3, 64)})
	}
	c.Flush()
	return c.Error()
}

// WriteTable prints the header and the summary as aligned text.
func (r *Report) WriteTable(w io.Writer) {
	h := r.Header
	fmt.Fprintf(w, "# %s  mpi=%s  ranks=%d on %d cores (%.1f ranks/core)  size=%s  scale=%g  reps=%d\n",
		h.Date, h.MPI, h.Ranks, h.Cores, h.RanksPerCore, cmp.Or(h.Size, "small"), h.Scale, h.Reps)
	if h.Compute != "" {
		fmt.Fprintf(w, "# %s\n", ComputeNote(h.Compute))
	}
	if h.Lab != "" {
		fmt.Fprintf(w, "# lab: %s\n", h.Lab)
	}
	fmt.Fprintf(w, "%-9s %-12s %-5s %3s %10s %10s %9s %9s %8s %10s %9s %9s %9s %10s  %s\n",
		"workload", "mode", "cross", "n", "min_s", "median_s", "ratio", "ratio_med", "gw_cpu_s", "gw_s/GiB", "gw_us/msg", "add_us/msg", "job_Mbit", "comp_Mbit", "status")
	for _, s := range r.Summary {
		status := "ok"
		if s.N == 0 {
			status = "FAILED: " + strings.Join(s.Errors, "; ")
		} else if s.Failed > 0 {
			status = fmt.Sprintf("%d failed", s.Failed)
		}
		dash := func(p *float64, prec int) string {
			if p == nil {
				return "-"
			}
			return strconv.FormatFloat(*p, 'f', prec, 64)
		}
		fmt.Fprintf(w, "%-9s %-12s %-5s %3d %10s %10s %9s %9s %8s %10s %9s %9s %9s %10s  %s\n", s.Workload, s.Mode,
			yesNo(s.Cross), s.N, dash(s.MinS, 3), dash(s.MedianS, 3), dash(s.RatioMin, 3),
			dash(s.RatioMedian, 3), dash(s.GatewayCPUS, 2), dash(s.GatewayCPUPerGiB, 2),
			dash(s.GatewayCPUPerMsgUs, 1), dash(s.AddedUsPerMsg, 1), dash(s.JobMbit, 0), dash(s.CompetingMbit, 0), status)
	}
}
