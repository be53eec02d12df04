package cli

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/units"
)

// The pflag.Value types below check a value when pflag sets it, so the
// parse error reads: invalid argument "70000" for "--lan-port" flag: ...

// IntRange is an int flag bounded to Min..Max.
type IntRange struct {
	P        *int
	Min, Max int
	What     string // "port", "bulk WAN connections", ...
}

func (v IntRange) String() string {
	if v.P == nil {
		return "0"
	}
	return strconv.Itoa(*v.P)
}

func (v IntRange) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want a whole number from %d to %d", v.Min, v.Max)
	}
	if n < v.Min || n > v.Max {
		return fmt.Errorf("%s %d out of range %d..%d", v.What, n, v.Min, v.Max)
	}
	*v.P = n
	return nil
}

func (v IntRange) Type() string { return "int" }

// Port is a TCP port flag (1..65535).
func Port(p *int) IntRange { return IntRange{P: p, Min: 1, Max: 65535, What: "port"} }

// Size is a byte-count flag (units.Size spellings) bounded to Min..Max;
// it keeps the text the user typed for String.
type Size struct {
	P        *int
	Min, Max int
	text     string
}

func (v *Size) String() string {
	if v.text != "" {
		return v.text
	}
	if v.P == nil {
		return "0"
	}
	return units.FormatSize(*v.P)
}

func (v *Size) Set(s string) error {
	n, err := units.Size(s)
	if err != nil {
		return err
	}
	if n < v.Min || n > v.Max {
		return fmt.Errorf("size %s out of range %s..%s", s, units.FormatSize(v.Min), units.FormatSize(v.Max))
	}
	*v.P, v.text = n, s
	return nil
}

func (v *Size) Type() string { return "size" }

// Rate is a bit/s flag (units.Rate spellings; 0 = none).
type Rate struct {
	P    *uint64
	text string
}

func (v *Rate) String() string {
	if v.text != "" {
		return v.text
	}
	if v.P == nil || *v.P == 0 {
		return "0"
	}
	return strconv.FormatUint(*v.P, 10)
}

func (v *Rate) Set(s string) error {
	r, err := units.Rate(s)
	if err != nil {
		return err
	}
	*v.P, v.text = r, s
	return nil
}

func (v *Rate) Type() string { return "rate" }

// Duration is a non-negative duration flag (0 usually means "off").
type Duration struct{ P *time.Duration }

func (v Duration) String() string {
	if v.P == nil {
		return "0s"
	}
	return v.P.String()
}

func (v Duration) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("bad duration %q (want e.g. 500us, 10ms, 2s; 0 for off)", s)
	}
	if d < 0 {
		return fmt.Errorf("negative duration %q", s)
	}
	*v.P = d
	return nil
}

func (v Duration) Type() string { return "duration" }

// Choice is a string flag taking one of a fixed set of words.
type Choice struct {
	P     *string
	Words []string
}

func (v Choice) String() string {
	if v.P == nil {
		return ""
	}
	return *v.P
}

func (v Choice) Set(s string) error {
	for _, w := range v.Words {
		if strings.EqualFold(s, w) {
			*v.P = w
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(v.Words, ", "))
}

func (v Choice) Type() string { return "string" }

// Checked is a string flag whose value check is a function (congestion
// controls: the kernel's list).
type Checked struct {
	P     *string
	Check func(string) error
}

func (v Checked) String() string {
	if v.P == nil {
		return ""
	}
	return *v.P
}

func (v Checked) Set(s string) error {
	if err := v.Check(s); err != nil {
		return err
	}
	*v.P = s
	return nil
}

func (v Checked) Type() string { return "string" }

// Not is a boolean flag stored negated: a setting on by default whose
// Config field is the exception (--wan-encrypt sets WANIntegrityOnly), so
// a Config left zero keeps the safe side.
type Not struct{ P *bool }

func (v Not) String() string {
	if v.P == nil {
		return "true"
	}
	return strconv.FormatBool(!*v.P)
}

func (v Not) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	*v.P = !b
	return nil
}

func (v Not) Type() string { return "bool" }

// AddrPort is an ip:port flag; unset, V is the zero (invalid) AddrPort.
type AddrPort struct{ V netip.AddrPort }

func (v *AddrPort) String() string {
	if !v.V.IsValid() {
		return ""
	}
	return v.V.String()
}

func (v *AddrPort) Set(s string) error {
	ap, err := ParseAddrPort(s)
	if err != nil {
		return err
	}
	v.V = ap
	return nil
}

// ParseAddrPort parses IP:PORT with an error that says which part is wrong
// and what would be right.
func ParseAddrPort(s string) (netip.AddrPort, error) {
	const want = "want IP:PORT, e.g. 10.0.0.2:5000 or [2001:db8::2]:5000"
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%s", want)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not an IP address (give the host's address, not its name): %s", host, want)
	}
	n, err := strconv.ParseInt(port, 10, 64)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q is not a number: %s", port, want)
	}
	if n < 1 || n > 65535 {
		return netip.AddrPort{}, fmt.Errorf("port %d out of range 1..65535", n)
	}
	return netip.AddrPortFrom(ip, uint16(n)), nil
}

func (v *AddrPort) Type() string { return "ip:port" }
