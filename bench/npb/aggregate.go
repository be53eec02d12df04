package npb

import (
	"slices"
	"sort"
)

// Summary aggregates the repetitions of one (workload, mode, cross) cell.
// Time fields are nil when no repetition succeeded, ratios also when the
// reference mode has no result: missing numbers stay missing.
type Summary struct {
	Workload string   `json:"workload"`
	Mode     string   `json:"mode"`
	Cross    bool     `json:"cross"`
	N        int      `json:"n"`      // verified repetitions
	Failed   int      `json:"failed"` // repetitions without a usable result
	MinS     *float64 `json:"min_s"`
	MedianS  *float64 `json:"median_s"`
	// Time relative to the reference mode (Modes[0], "direct") for the same
	// workload and traffic: < 1 means faster than direct.
	RatioMin    *float64 `json:"ratio_min"`
	RatioMedian *float64 `json:"ratio_median"`
	// The gateways' CPU seconds (user + system, all gateways of the run
	// together) while the job ran, median over the repetitions, and per
	// GiB they forwarded (sent plus received on the WAN; runs that
	// forwarded under a MiB left out). Unset for direct runs.
	GatewayCPUS      *float64 `json:"gw_cpu_s,omitempty"`
	GatewayCPUPerGiB *float64 `json:"gw_cpu_s_per_gib,omitempty"`
	// The competing flows' mean rate while the job ran, Mbit/s, median
	// over the repetitions (runs beside them on the lab): what a mode
	// left them of the WAN.
	CompetingMbit *float64 `json:"competing_mbit_s,omitempty"`
	// The job's own inter-site payload rate, Mbit/s (the workload's WAN
	// bytes, both directions, over its time), median over the
	// repetitions: its share of the WAN beside CompetingMbit.
	JobMbit *float64 `json:"job_mbit_s,omitempty"`
	// The gateways' CPU per inter-site message of the job, µs (all
	// gateways together over the workload's WAN messages), median over
	// the repetitions. Unset for direct runs.
	GatewayCPUPerMsgUs *float64 `json:"gw_cpu_us_per_msg,omitempty"`
	// What each of a rank's inter-site messages added to the job's time
	// against the reference mode, µs: the median time's difference over
	// the median of the WAN messages one rank sent. An upper bound of
	// the added latency per message when every message is on a rank's
	// critical path (latency-bound kernels); negative when faster.
	AddedUsPerMsg *float64 `json:"added_us_per_msg,omitempty"`
	Errors        []string `json:"errors,omitempty"` // distinct failure reasons
}

// PingSummary is one point of a ping-pong curve over the repetitions: the
// best minimum latency, the median of the median latencies and bandwidths.
type PingSummary struct {
	Mode     string  `json:"mode"`
	Cross    bool    `json:"cross"`
	Size     int     `json:"size"`
	N        int     `json:"n"`
	LatMinUs float64 `json:"lat_us_min"`
	LatMedUs float64 `json:"lat_us_med"`
	BWMBps   float64 `json:"bw_MBps"`
	// The lowest and highest of the repetitions' median latencies and
	// bandwidths: the spread figures draw (0 in older reports).
	LatMedLoUs float64 `json:"lat_us_med_lo,omitempty"`
	LatMedHiUs float64 `json:"lat_us_med_hi,omitempty"`
	BWLoMBps   float64 `json:"bw_MBps_lo,omitempty"`
	BWHiMBps   float64 `json:"bw_MBps_hi,omitempty"`
}

// Median of xs (which it sorts); the mean of the middle two for even n.
func Median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func ptr(v float64) *float64 { return &v }

type cellKey struct {
	workload, mode string
	cross          bool
}

// Summarize aggregates samples per cell, in the order workloads (first
// appearance), without then with competing traffic, then modes as given.
// ref names the mode ratios are computed against.
func Summarize(samples []Sample, modes []string, ref string) []Summary {
	var workloads []string
	seenW := map[string]bool{}
	crossSeen := map[bool]bool{}
	times := map[cellKey][]float64{}
	cpus := map[cellKey][]float64{}
	perGiB := map[cellKey][]float64{}
	competing := map[cellKey][]float64{}
	jobMbit := map[cellKey][]float64{}
	perMsg := map[cellKey][]float64{}
	rankMsgs := map[cellKey][]float64{}
	sums := map[cellKey]*Summary{}
	for _, s := range samples {
		if !seenW[s.Workload] {
			seenW[s.Workload] = true
			workloads = append(workloads, s.Workload)
		}
		crossSeen[s.Cross] = true
		k := cellKey{s.Workload, s.Mode, s.Cross}
		sum := sums[k]
		if sum == nil {
			sum = &Summary{Workload: s.Workload, Mode: s.Mode, Cross: s.Cross}
			sums[k] = sum
		}
		if s.OK() {
			sum.N++
			times[k] = append(times[k], s.Result.TimeS)
			res := s.Result
			if cpu, wan, ok := s.gatewayCPU(); ok {
				cpus[k] = append(cpus[k], cpu)
				if wan >= 1<<20 {
					perGiB[k] = append(perGiB[k], cpu/(float64(wan)/(1<<30)))
				}
				if res.WANMsgs > 0 {
					perMsg[k] = append(perMsg[k], cpu/float64(res.WANMsgs)*1e6)
				}
			}
			if res.TimeS > 0 && res.WANBytes > 0 {
				jobMbit[k] = append(jobMbit[k], float64(res.WANBytes)*8/res.TimeS/1e6)
			}
			if res.WANMsgs > 0 && res.Ranks > 0 {
				rankMsgs[k] = append(rankMsgs[k], float64(res.WANMsgs)/float64(res.Ranks))
			}
			if s.Competing != nil {
				competing[k] = append(competing[k], s.Competing.Mbit())
			}
		} else {
			sum.Failed++
			if !slices.Contains(sum.Errors, s.Err) {
				sum.Errors = append(sum.Errors, s.Err)
			}
		}
	}
	for k, ts := range times {
		sums[k].MinS = ptr(minOf(ts))
		sums[k].MedianS = ptr(Median(append([]float64(nil), ts...)))
	}
	for k, v := range cpus {
		sums[k].GatewayCPUS = ptr(Median(v))
	}
	for k, v := range perGiB {
		sums[k].GatewayCPUPerGiB = ptr(Median(v))
	}
	for k, v := range competing {
		sums[k].CompetingMbit = ptr(Median(v))
	}
	for k, v := range jobMbit {
		sums[k].JobMbit = ptr(Median(v))
	}
	for k, v := range perMsg {
		sums[k].GatewayCPUPerMsgUs = ptr(Median(v))
	}
	var out []Summary
	for _, w := range workloads {
		for _, x := range []bool{false, true} {
			if !crossSeen[x] {
				continue
			}
			base := sums[cellKey{w, ref, x}]
			for _, m := range modes {
				sum := sums[cellKey{w, m, x}]
				if sum == nil {
					continue
				}
				if base != nil && base.MinS != nil && sum.MinS != nil && *base.MinS > 0 {
					sum.RatioMin = ptr(*sum.MinS / *base.MinS)
					sum.RatioMedian = ptr(*sum.MedianS / *base.MedianS)
					if n := rankMsgs[cellKey{w, m, x}]; m != ref && len(n) > 0 {
						sum.AddedUsPerMsg = ptr((*sum.MedianS - *base.MedianS) / Median(n) * 1e6)
					}
				}
				out = append(out, *sum)
			}
		}
	}
	return out
}

// SummarizePing aggregates the ping-pong curves per mode and traffic.
func SummarizePing(samples []Sample) []PingSummary {
	type key struct {
		mode  string
		cross bool
		size  int
	}
	mins := map[key][]float64{}
	meds := map[key][]float64{}
	bws := map[key][]float64{}
	var order []key
	for _, s := range samples {
		if !s.OK() {
			continue
		}
		for _, p := range s.PingPong {
			k := key{s.Mode, s.Cross, p.Size}
			if _, ok := mins[k]; !ok {
				order = append(order, k)
			}
			mins[k] = append(mins[k], p.LatMinUs)
			meds[k] = append(meds[k], p.LatMedUs)
			bws[k] = append(bws[k], p.BWMBps)
		}
	}
	// Curves in first-appearance order, sizes ascending within a curve.
	curve := map[[2]any]int{}
	for _, k := range order {
		c := [2]any{k.mode, k.cross}
		if _, ok := curve[c]; !ok {
			curve[c] = len(curve)
		}
	}
	sort.Slice(order, func(i, j int) bool {
		ci, cj := curve[[2]any{order[i].mode, order[i].cross}], curve[[2]any{order[j].mode, order[j].cross}]
		if ci != cj {
			return ci < cj
		}
		return order[i].size < order[j].size
	})
	out := make([]PingSummary, 0, len(order))
	for _, k := range order {
		out = append(out, PingSummary{Mode: k.mode, Cross: k.cross, Size: k.size, N: len(mins[k]),
			LatMinUs: minOf(mins[k]), LatMedUs: Median(meds[k]), BWMBps: Median(bws[k]),
			LatMedLoUs: slices.Min(meds[k]), LatMedHiUs: slices.Max(meds[k]),
			BWLoMBps: slices.Min(bws[k]), BWHiMBps: slices.Max(bws[k])})
	}
	return out
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs[1:] {
		if x < m {
			m = x
		}
	}
	return m
}
