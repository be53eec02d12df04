package units

import "testing"

func TestRate(t *testing.T) {
	good := map[string]uint64{
		"200mbit": 200e6, "1gbit": 1e9, "500kbit": 500e3, "1000000": 1e6, "100mbps": 800e6,
		"2.5Gbit": 2.5e9, "0": 0, "unlimited": 0, "10m": 10e6,
	}
	for in, want := range good {
		if got, err := Rate(in); err != nil || got != want {
			t.Errorf("Rate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fast", "-1mbit", "10xbit", "1bit", "NaN", "1000gbit"} {
		if _, err := Rate(in); err == nil {
			t.Errorf("Rate(%q) accepted", in)
		}
	}
}

func TestSize(t *testing.T) {
	for in, want := range map[string]int{"131072": 131072, "128KiB": 128 << 10, "4MiB": 4 << 20, "1G": 1 << 30, " 64 kb ": 64 << 10, "0": 0} {
		if got, err := Size(in); err != nil || got != want {
			t.Errorf("Size(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1.5MiB", "12TiB", "99999999999999GiB"} {
		if _, err := Size(bad); err == nil {
			t.Errorf("Size(%q) accepted", bad)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int]string{0: "0", 1000: "1000", 128 << 10: "128KiB", 4 << 20: "4MiB", 1 << 30: "1GiB", 68 << 10: "68KiB", 1536: "1536"} {
		got := FormatSize(n)
		if got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
		if back, err := Size(got); err != nil || back != n {
			t.Errorf("Size(FormatSize(%d)) = %d, %v", n, back, err)
		}
	}
}
