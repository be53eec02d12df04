// Package npb runs the with/without-gateway comparison: the MPI workloads of
// bench/workloads (and optionally the user's real NPB binaries) in each mode,
// repeated and interleaved, then aggregates, writes CSV/JSON and draws the
// figures.
package npb

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/mpi5k/mpi5k/wrap"
)

// Result is one MPI5K-RESULT line of bench/workloads/mpi5k-workload, or the
// report of a real NPB binary (MPI "npb").
type Result struct {
	Workload   string  `json:"workload"`
	MPI        string  `json:"mpi"`
	Ranks      int     `json:"ranks"`
	Sites      int     `json:"sites"`
	TimeS      float64 `json:"time_s"`
	ComputeS   float64 `json:"compute_s"`
	Bytes      uint64  `json:"bytes"`
	Msgs       uint64  `json:"msgs"`
	WANBytes   uint64  `json:"wan_bytes"`
	WANMsgs    uint64  `json:"wan_msgs"`
	Failures   uint64  `json:"failures"`
	LoopsPerUs float64 `json:"loops_per_us"`
	Verified   bool    `json:"verified"`
}

// PingPoint is one MPI5K-PINGPONG line: one message size.
type PingPoint struct {
	Size     int     `json:"size"`
	Reps     int     `json:"reps"`
	LatMinUs float64 `json:"lat_us_min"`
	LatMedUs float64 `json:"lat_us_med"`
	BWMBps   float64 `json:"bw_MBps"`
}

// GatewayCPU is one MPI5K-GATEWAY line of `mpi5k run`'s summary: what a
// gateway spent on the CPU (user + system) while the job ran and the WAN
// bytes it sent plus received meanwhile.
type GatewayCPU struct {
	Site      string  `json:"site"`
	CPUS      float64 `json:"cpu_s"`
	WANBytes  uint64  `json:"wan_bytes"`
	CPUTotalS float64 `json:"cpu_total_s"` // since the gateway started
	// The express link's renewals, and its yields to another flow's
	// queue, during the job (absent from the lines of older mpi5k run).
	Renewals uint64 `json:"renewals,omitempty"`
	Yields   uint64 `json:"yields,omitempty"`
}

// CrossBytes is the MPI5K-CROSS line of a lab run beside competing
// flows: the bytes they sent while the job ran, over its seconds.
type CrossBytes struct {
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// Mbit is the competing flows' mean rate in Mbit/s.
func (c CrossBytes) Mbit() float64 {
	if c.Seconds <= 0 {
		return 0
	}
	return float64(c.Bytes) * 8 / c.Seconds / 1e6
}

// Output is everything machine-readable in one run's output.
type Output struct {
	Results   []Result
	PingPong  []PingPoint
	Gateways  []GatewayCPU
	Cross     *CrossBytes
	VerifyErr []string // "VERIFICATION FAILED ..." lines, verbatim
}

const (
	resultTag = "MPI5K-RESULT"
	pingTag   = "MPI5K-PINGPONG"
	verifyTag = "VERIFICATION FAILED"
)

// fields splits "k=v k=v" into a map; a token without '=' is an error so a
// garbled line is not half-read.
func fields(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, tok := range strings.Fields(s) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("token %q is not key=value", tok)
		}
		m[k] = v
	}
	return m, nil
}

// kv reads typed values out of a field map, remembering the first error.
type kv struct {
	m   map[string]string
	err error
}

func (p *kv) str(k string) string {
	v, ok := p.m[k]
	if !ok && p.err == nil {
		p.err = fmt.Errorf("missing %s=", k)
	}
	return v
}

func (p *kv) f64(k string) float64 {
	s := p.str(k)
	if p.err != nil {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		p.err = fmt.Errorf("%s=%q: not a number", k, s)
	}
	return v
}

func (p *kv) u64(k string) uint64 {
	s := p.str(k)
	if p.err != nil {
		return 0
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		p.err = fmt.Errorf("%s=%q: not an unsigned integer", k, s)
	}
	return v
}

func (p *kv) int(k string) int {
	v := p.u64(k)
	if v > 1<<31 && p.err == nil {
		p.err = fmt.Errorf("%s=%d: too large", k, v)
	}
	return int(v)
}

// ParseResult parses the text after "MPI5K-RESULT".
func ParseResult(s string) (Result, error) {
	m, err := fields(s)
	if err != nil {
		return Result{}, err
	}
	p := &kv{m: m}
	r := Result{
		Workload:   p.str("workload"),
		MPI:        p.str("mpi"),
		Ranks:      p.int("ranks"),
		Sites:      p.int("sites"),
		TimeS:      p.f64("time_s"),
		ComputeS:   p.f64("compute_s"),
		Bytes:      p.u64("bytes"),
		Msgs:       p.u64("msgs"),
		WANBytes:   p.u64("wan_bytes"),
		WANMsgs:    p.u64("wan_msgs"),
		Failures:   p.u64("failures"),
		LoopsPerUs: p.f64("loops_per_us"),
	}
	switch v := p.str("verified"); v {
	case "yes":
		r.Verified = true
	case "no":
	default:
		if p.err == nil {
			p.err = fmt.Errorf("verified=%q: want yes or no", v)
		}
	}
	if p.err == nil && r.TimeS < 0 {
		p.err = fmt.Errorf("time_s=%g: negative", r.TimeS)
	}
	return r, p.err
}

// ParseGatewayCPU parses the text after "MPI5K-GATEWAY".
func ParseGatewayCPU(s string) (GatewayCPU, error) {
	m, err := fields(s)
	if err != nil {
		return GatewayCPU{}, err
	}
	p := &kv{m: m}
	g := GatewayCPU{Site: p.str("site"), CPUS: p.f64("cpu_s"), WANBytes: p.u64("wan_bytes"), CPUTotalS: p.f64("cpu_total_s")}
	if _, ok := m["renewals"]; ok {
		g.Renewals = p.u64("renewals")
	}
	if _, ok := m["yields"]; ok {
		g.Yields = p.u64("yields")
	}
	return g, p.err
}

// ParsePingPoint parses the text after "MPI5K-PINGPONG".
func ParsePingPoint(s string) (PingPoint, error) {
	m, err := fields(s)
	if err != nil {
		return PingPoint{}, err
	}
	p := &kv{m: m}
	pt := PingPoint{
		Size:     p.int("size"),
		Reps:     p.int("reps"),
		LatMinUs: p.f64("lat_us_min"),
		LatMedUs: p.f64("lat_us_med"),
		BWMBps:   p.f64("bw_MBps"),
	}
	return pt, p.err
}

// NPB's own report (NPB 3.x MPI), for --npb-dir runs of real binaries:
//
//	BT Benchmark Completed.
//	Time in seconds =                    12.34
//	Total processes =                        4
//	Verification    =               SUCCESSFUL
var (
	npbDone   = regexp.MustCompile(`^\s*([A-Z]{2}) Benchmark Completed\.`)
	npbTime   = regexp.MustCompile(`^\s*Time in seconds\s*=\s*(\S+)`)
	npbProcs  = regexp.MustCompile(`^\s*Total processes\s*=\s*(\d+)`)
	npbVerify = regexp.MustCompile(`^\s*Verification\s*=\s*(\S+)`)
)

// npbReport accumulates NPB's report lines; result turns them into a Result
// (MPI "npb") when the report is complete.
type npbReport struct {
	name, time, procs, verify string
}

func (n *npbReport) line(s string) {
	if m := npbDone.FindStringSubmatch(s); m != nil {
		n.name = strings.ToLower(m[1])
	} else if m := npbTime.FindStringSubmatch(s); m != nil {
		n.time = m[1]
	} else if m := npbProcs.FindStringSubmatch(s); m != nil {
		n.procs = m[1]
	} else if m := npbVerify.FindStringSubmatch(s); m != nil {
		n.verify = m[1]
	}
}

func (n *npbReport) result() (*Result, error) {
	if n.name == "" && n.time == "" && n.verify == "" {
		return nil, nil
	}
	if n.name == "" || n.time == "" || n.verify == "" {
		return nil, fmt.Errorf("incomplete NPB report (benchmark %q, time %q, verification %q)", n.name, n.time, n.verify)
	}
	t, err := strconv.ParseFloat(n.time, 64)
	if err != nil || t < 0 {
		return nil, fmt.Errorf("NPB time %q: not a number", n.time)
	}
	p, _ := strconv.Atoi(n.procs)
	// NPB says SUCCESSFUL or UNSUCCESSFUL; anything else is not a pass.
	ok := n.verify == "SUCCESSFUL"
	r := &Result{Workload: n.name, MPI: "npb", Ranks: p, TimeS: t, Verified: ok}
	if !ok {
		r.Failures = 1
	}
	return r, nil
}

// ParseOutput reads a run's combined output. Lines that are not ours (MPI
// launcher chatter, human lines) are skipped; a line with our tag that does
// not parse is an error naming its line number.
func ParseOutput(r io.Reader) (Output, error) {
	var out Output
	var npb npbReport
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, resultTag+" "):
			res, err := ParseResult(line[len(resultTag)+1:])
			if err != nil {
				return out, fmt.Errorf("line %d: %s: %w", n, resultTag, err)
			}
			out.Results = append(out.Results, res)
		case strings.HasPrefix(line, pingTag+" "):
			pt, err := ParsePingPoint(line[len(pingTag)+1:])
			if err != nil {
				return out, fmt.Errorf("line %d: %s: %w", n, pingTag, err)
			}
			out.PingPong = append(out.PingPong, pt)
		case strings.HasPrefix(line, wrap.GatewayTag+" "):
			g, err := ParseGatewayCPU(line[len(wrap.GatewayTag)+1:])
			if err != nil {
				return out, fmt.Errorf("line %d: %s: %w", n, wrap.GatewayTag, err)
			}
			out.Gateways = append(out.Gateways, g)
		case strings.HasPrefix(line, crossTag+" "):
			m, err := fields(line[len(crossTag)+1:])
			if err != nil {
				return out, fmt.Errorf("line %d: %s: %w", n, crossTag, err)
			}
			p := &kv{m: m}
			c := CrossBytes{Bytes: p.u64("bytes"), Seconds: p.f64("seconds")}
			if p.err != nil {
				return out, fmt.Errorf("line %d: %s: %w", n, crossTag, p.err)
			}
			out.Cross = &c
		case strings.Contains(line, verifyTag):
			out.VerifyErr = append(out.VerifyErr, line)
		default:
			npb.line(line)
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	res, err := npb.result()
	if err != nil {
		return out, err
	}
	if res != nil {
		if !res.Verified {
			out.VerifyErr = append(out.VerifyErr, "NPB Verification = "+npb.verify)
		}
		out.Results = append(out.Results, *res)
	}
	return out, nil
}
