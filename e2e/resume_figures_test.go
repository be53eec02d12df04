package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestResumeFigures measures WAN resume on a two-site lab of 20 ms RTT and
// 200 Mbit/s, for bench/resume.sh (skipped otherwise: a measurement, not
// a check):
//
//   - outage: a 64-byte ping-pong every 10 ms through the express link
//     while both WAN connections are killed (ss -K) twice; the longest
//     round trip against the median is the pause the ranks see;
//   - throughput lost per kill: one bulk stream for 10 s, without kills
//     and with a kill every 2 s, alternating;
//   - the replay lists' memory: the most mpi5k_wan_replay_bytes the
//     sending gateway reported during the bulk runs.
func TestResumeFigures(t *testing.T) {
	if os.Getenv("MPI5K_RESUME_FIGURES") == "" {
		t.Skip("a measurement: run bench/resume.sh")
	}
	reps, _ := strconv.Atoi(os.Getenv("MPI5K_RESUME_REPEATS"))
	reps = max(reps, 1)
	w := newWANLab(t, 20*time.Millisecond)
	startLabGateways(t, w.ctx, w.l, "--metrics", "0.0.0.0:9105")
	site1, _ := w.m.Site("site1")
	site2, _ := w.m.Site("site2")
	port := strconv.Itoa(int(site2.WAN.Port()))
	gws := []string{w.l.Gateway("site1"), w.l.Gateway("site2")}
	kill := func(host string) int {
		out, err := exec.Command("nsenter", "--net="+w.l.NetNSPath(host), "ss", "-K", "-t", "-n",
			"( sport = :"+port+" or dport = :"+port+" )").CombinedOutput()
		if err != nil {
			t.Fatalf("ss -K: %v: %s", err, out)
		}
		return strings.Count(string(out), "ESTAB")
	}
	replay := func() float64 {
		text, err := w.scrape(t, w.src, site1.LAN.Addr())
		if err != nil {
			return -1
		}
		return metricSum(text, "mpi5k_wan_replay_bytes")
	}

	var p50s, maxes []float64
	for r := range reps {
		res := make(chan []float64, 1)
		go func() { res <- run(t, w.ctx, w.l, w.src, "pingpong", w.echo, w.gwLAN, "300", "64", "10") }()
		time.Sleep(1500 * time.Millisecond)
		k := kill(gws[r%2])
		time.Sleep(1500 * time.Millisecond)
		k += kill(gws[(r+1)%2])
		v := <-res
		if len(v) != 3 || k < 2 {
			t.Fatalf("ping-pong %v, %d connections killed", v, k)
		}
		t.Logf("outage %d: ping-pong p50 %.1f ms, p99 %.1f ms, longest %.1f ms (2 kills, %d connections)", r+1, v[0]/1e3, v[1]/1e3, v[2]/1e3, k)
		p50s, maxes = append(p50s, v[0]/1e3), append(maxes, v[2]/1e3)
	}

	var clean, killed, lost, held []float64
	for r := range reps {
		for _, kills := range []bool{r%2 == 1, r%2 == 0} { // alternate which goes first
			stop := make(chan struct{})
			done := make(chan struct{})
			most, n := 0.0, 0
			go func() {
				defer close(done)
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				next := time.Now().Add(2 * time.Second)
				for i := 0; ; {
					select {
					case <-stop:
						return
					case now := <-tick.C:
						most = max(most, replay())
						if kills && now.After(next) && n < 4 {
							n += min(kill(gws[i%2]), 1)
							i++
							next = next.Add(2 * time.Second)
						}
					}
				}
			}()
			v := run(t, w.ctx, w.l, w.src, "send", w.sink, w.gwLAN, "10")
			close(stop)
			<-done
			mbit := v[0] * 8 / v[1] / 1e6
			what := "no kill"
			if kills {
				what = fmt.Sprintf("%d kills", n)
				killed = append(killed, mbit)
			} else {
				clean = append(clean, mbit)
			}
			held = append(held, most)
			t.Logf("bulk %d, %s: %.1f Mbit/s over %.1f s, replay lists held at most %.0f KiB", r+1, what, mbit, v[1], most/1024)
			if kills && n > 0 && len(clean) > 0 {
				lost = append(lost, (clean[len(clean)-1]-mbit)*v[1]/8/float64(n)) // MB per kill
			}
		}
	}
	mm := func(v []float64) string {
		s := slices.Clone(v)
		slices.Sort(s)
		return fmt.Sprintf("%.1f / %.1f", s[0], s[len(s)/2])
	}
	t.Logf("min / median of %d: ping-pong p50 %s ms, longest round trip %s ms; bulk %s Mbit/s without kills, %s with a kill every 2 s; lost per kill %s MB; replay lists at most %s KiB",
		reps, mm(p50s), mm(maxes), mm(clean), mm(killed), mm(lost), mm(func() []float64 {
			k := make([]float64, len(held))
			for i, h := range held {
				k[i] = h / 1024
			}
			return k
		}()))
}
