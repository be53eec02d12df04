// Package units parses the quantities operators type on command lines: data
// rates ("200mbit") and byte sizes ("128KiB"). The lab, the gateway and the
// wrapper share it so one spelling means the same everywhere.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Rate parses a data rate into bit/s: "200mbit", "1gbit", "500kbit",
// "1000000" (bit/s), "100mbps" (bytes/s, as tc spells it), "10m", and
// "0"/"unlimited"/"none" for no limit (0).
func Rate(s string) (uint64, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "0" || v == "unlimited" || v == "none" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{
		{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
		{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
		{"g", 1e9}, {"m", 1e6}, {"k", 1e3},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(v, u.suffix) {
			v = strings.TrimSuffix(v, u.suffix)
			mult = u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, fmt.Errorf("bad rate %q (examples: 200mbit, 1gbit, 500kbit)", s)
	}
	r := f * mult
	if r > 0 && r < 8000 {
		return 0, fmt.Errorf("rate %q below 8kbit", s)
	}
	if r > 400e9 {
		return 0, fmt.Errorf("rate %q above 400gbit", s)
	}
	return uint64(r), nil
}

// Size parses a byte count: a plain number or one with a K/KB/KiB, M/MB/MiB
// or G/GB/GiB suffix, all binary (socket buffers and chunks are powers of
// two in practice).
func Size(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	for _, u := range []struct {
		suf string
		m   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suf)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suf)]), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/int64(mult) {
		return 0, fmt.Errorf("bad size %q (want e.g. 131072, 128KiB, 4MiB)", s)
	}
	return int(n) * mult, nil
}

// FormatSize writes n as Size reads it, in the largest binary unit that
// divides it: 131072 is "128KiB", 1000 stays "1000".
func FormatSize(n int) string {
	for _, u := range []struct {
		suf string
		m   int
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.suf)
		}
	}
	return strconv.Itoa(n)
}
