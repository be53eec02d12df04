package npb

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Plain words for what tables and figures show: a reader who never saw the
// command line must still know what a series is.

// ModeLabel names a mode in plain words for legends: "direct (no
// gateways)", "through the gateways", "gateways without express link".
// A mode's flags of `mpi5k run` are spelled out; a flag this table does not
// know stays as given, which is still what ran.
func ModeLabel(m Mode) string {
	switch m.Kind {
	case KindDirect:
		return "direct (no gateways)"
	case KindRelay:
		return "plain relay chain (socat)"
	}
	var parts []string
	if m.LANCC != "" {
		parts = append(parts, "LAN TCP "+m.LANCC)
	}
	if m.WANCC != "" {
		parts = append(parts, "WAN TCP "+m.WANCC)
	}
	if m.WANConns > 0 {
		parts = append(parts, plural(m.WANConns, "bulk WAN connection"))
	}
	parts = append(parts, flagWords(m.Args)...)
	if len(parts) == 0 {
		return "through the gateways"
	}
	if strings.HasPrefix(parts[0], "without ") || strings.HasPrefix(parts[0], "at ") {
		return "gateways " + strings.Join(parts, ", ")
	}
	return "gateways, " + strings.Join(parts, ", ")
}

func plural(n int, what string) string {
	s := strconv.Itoa(n) + " " + what
	if n != 1 {
		s += "s"
	}
	return s
}

// flagWords are the plain words of `mpi5k run` flags a --gw-mode gives.
// Off switches (--x=false) say what is missing, valued flags what they
// set.
var (
	offWords = map[string]string{
		"wan-express":        "without express link",
		"wan-stripe":         "without striping",
		"poll-thread":        "without poll thread",
		"quiet-runtime":      "without quiet runtime",
		"wan-express-renew":  "express link never renewed",
		"wan-express-yield":  "express link never yields",
		"wan-prime":          "without BBR priming",
		"wan-skip-probe-rtt": "without ProbeRTT skipping",
		"wan-keep-warm":      "without keep-warm check",
		"wan-encrypt":        "WAN authenticated, not encrypted",
		"dedicated-gateways": "gateways share nodes with ranks",
	}
	onWords = map[string]string{
		"wan-plaintext":      "unencrypted, unauthenticated WAN",
		"dedicated-gateways": "on dedicated gateway hosts",
		"wan-express":        "with express link",
		"keep":               "",
		"wan-keep-warm":      "",
	}
	valueWords = map[string]func(v string) string{
		"wan-conns":         func(v string) string { return v + " bulk WAN connections" },
		"wan-queue":         func(v string) string { return queueWords(v) },
		"priority":          func(v string) string { return "at nice " + v },
		"wan-pace":          func(v string) string { return "paced at " + v },
		"wan-cc":            func(v string) string { return "WAN TCP " + v },
		"lan-cc":            func(v string) string { return "LAN TCP " + v },
		"wan-express-cc":    func(v string) string { return "express link TCP " + v },
		"lan-transport":     func(v string) string { return "LAN transport " + v },
		"chunk":             func(v string) string { return v + " WAN frames" },
		"window":            func(v string) string { return v + " stream window" },
		"cpu-profile":       func(string) string { return "profiled" },
		"trace":             func(string) string { return "traced" },
		"gateway-bin":       binWords,
		"wan-notsent-lowat": func(v string) string { return "not-sent low mark " + v },
	}
)

func queueWords(v string) string {
	if v == "0" || v == "0s" {
		return "without queue control"
	}
	return "WAN queue kept to " + v
}

// binWords names another gateway program: the floor relay by its purpose,
// anything else by its file name.
func binWords(p string) string {
	if filepath.Base(p) == "floorgw" {
		return "plain relay pair (floorgw)"
	}
	return "gateway program " + filepath.Base(p)
}

var boolFlag = regexp.MustCompile(`^--([a-z0-9-]+)(?:=(true|false))?$`)

func flagWords(args []string) []string {
	var out []string
	floor := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if f, ok := valueWords[name]; ok && strings.HasPrefix(a, "--") {
			if !hasVal && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				val = args[i]
			}
			if w := f(val); w != "" {
				floor = floor || strings.Contains(w, "floorgw")
				out = append(out, w)
			}
			continue
		}
		if m := boolFlag.FindStringSubmatch(a); m != nil {
			words := onWords
			if m[2] == "false" {
				words = offWords
			}
			if w, ok := words[m[1]]; ok {
				if w != "" && !(floor && m[1] == "wan-plaintext") {
					out = append(out, w)
				}
				continue
			}
		}
		out = append(out, a) // unknown: as given
	}
	return out
}

// PlainMode is ModeLabel of the mode named name in modes, or the name
// itself when the report does not list it.
func PlainMode(modes []Mode, name string) string {
	for _, m := range modes {
		if m.Name == name {
			return ModeLabel(m)
		}
	}
	return name
}
