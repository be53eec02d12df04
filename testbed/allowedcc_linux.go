package testbed

// A network namespace other than the initial one may take as its default
// TCP congestion control only an algorithm of the global
// net.ipv4.tcp_allowed_congestion_control. On this project's machines that
// list is "reno bbr", while the cluster nodes a lab stands for run CUBIC,
// Linux's default. A lab whose --host-cc is missing from the list adds it
// for as long as a lab needs it:
//
//   - RunDir/tcp-allowed-cc.json records the list as it was before the
//     first addition and what the labs added. It is written before the
//     sysctl, so a crash in between leaves a record of an addition that may
//     not have happened, which is harmless to undo.
//   - Each lab's need is its lab.json's HostCC: the labs' state
//     directories are the reference count. lab up saves lab.json before it
//     adds, lab down removes it before it settles.
//   - Settling (every lab up and lab down) removes each added algorithm no
//     remaining lab needs, never one that was in the list before, and
//     drops the record once nothing added is left. A record whose labs
//     are gone (a crash between a lab's removal and its settling, or a
//     state directory removed by hand) is settled by the next lab up or
//     lab down of any lab.
//
// The machine's own default (net.ipv4.tcp_congestion_control of the
// initial namespace) is never written.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ccBook is where the bookkeeping reads and writes: the kernel's files in
// production, temporary files in tests.
type ccBook struct {
	allowed   string // net.ipv4.tcp_allowed_congestion_control
	available string // net.ipv4.tcp_available_congestion_control
	runDir    string // the record, its lock and the labs' state directories
	// load loads the module of an algorithm the kernel lacks (nil: never).
	load func(cc string) error
}

var sysCC = ccBook{
	allowed:   "/proc/sys/net/ipv4/tcp_allowed_congestion_control",
	available: "/proc/sys/net/ipv4/tcp_available_congestion_control",
	runDir:    RunDir,
	load:      modprobeCC,
}

// ccRecord is RunDir/tcp-allowed-cc.json.
type ccRecord struct {
	Before []string // the allowed list before the first addition
	Added  []string // what labs added and may still need
}

const ccRecordName = "tcp-allowed-cc.json"

func (b ccBook) recordPath() string { return filepath.Join(b.runDir, ccRecordName) }

func readCCList(path string) ([]string, error) {
	s, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(s)), nil
}

// lock serializes the labs' changes to the list across processes.
func (b ccBook) lock() (unlock func(), err error) {
	if err := os.MkdirAll(b.runDir, 0o755); err != nil {
		return nil, err
	}
	// 0600: flock needs only an open file, and a user who could open it
	// could hold the lock and stall every lab up and down.
	f, err := os.OpenFile(filepath.Join(b.runDir, "tcp-allowed-cc.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// check fails, before anything is built, if the kernel cannot run cc at
// all. An algorithm built as a module is loaded (it stays loaded: other
// sockets may use it by then); note says so.
func (b ccBook) check(flag, cc string) (note string, err error) {
	if cc == "" {
		return "", nil
	}
	avail, err := readCCList(b.available)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if slices.Contains(avail, cc) {
		return "", nil
	}
	var lerr error = errors.New("no module loader")
	if b.load != nil {
		lerr = b.load(cc)
	}
	if lerr == nil {
		if avail2, err := readCCList(b.available); err == nil && slices.Contains(avail2, cc) {
			return fmt.Sprintf("loaded kernel module tcp_%s for %s %s (it stays loaded)", cc, flag, cc), nil
		}
		lerr = errors.New("loaded, yet not listed")
	}
	return "", fmt.Errorf("%s: %q is not available in this kernel (net.ipv4.tcp_available_congestion_control: %s) and module tcp_%s does not load (%v): pick one of %s",
		flag, cc, strings.Join(avail, " "), cc, lerr, strings.Join(avail, ", "))
}

// modprobeCC loads tcp_<cc> if modprobe finds such a module.
func modprobeCC(cc string) error {
	if _, err := exec.LookPath("modprobe"); err != nil {
		return err
	}
	out, err := exec.Command("modprobe", "-q", "tcp_"+cc).CombinedOutput()
	if err != nil {
		if s := strings.TrimSpace(string(out)); s != "" {
			return fmt.Errorf("modprobe tcp_%s: %s", cc, s)
		}
		return fmt.Errorf("modprobe tcp_%s: %w", cc, err)
	}
	return nil
}

// hold makes cc a possible namespace default for lab, whose lab.json must
// already name it as HostCC. The note tells what changed ("" if nothing).
func (b ccBook) hold(lab, cc string) (note string, err error) {
	if cc == "" {
		return "", nil
	}
	unlock, err := b.lock()
	if err != nil {
		return "", fmt.Errorf("host-cc: %w", err)
	}
	defer unlock()
	cur, err := readCCList(b.allowed)
	if err != nil {
		return "", fmt.Errorf("host-cc: %w", err)
	}
	if slices.Contains(cur, cc) {
		return "", nil
	}
	rec, err := b.readRecord()
	if err != nil {
		return "", err
	}
	if rec == nil {
		rec = &ccRecord{Before: cur}
	}
	if !slices.Contains(rec.Added, cc) {
		rec.Added = append(rec.Added, cc)
	}
	// The record first: a crash after it leaves something to undo, never
	// an addition nobody knows of.
	if err := b.writeRecord(rec); err != nil {
		return "", err
	}
	if err := writeCCList(b.allowed, append(cur, cc)); err != nil {
		return "", fmt.Errorf("host-cc: add %s to net.ipv4.tcp_allowed_congestion_control: %w", cc, err)
	}
	return fmt.Sprintf("net.ipv4.tcp_allowed_congestion_control: added %s for the lab's hosts (was %q; restored when no lab uses it, at lab down)",
		cc, strings.Join(cur, " ")), nil
}

// settle removes from the allowed list every algorithm the labs added that
// no lab with a state directory (but gone, being taken down) needs. The
// note tells what changed ("" if nothing).
func (b ccBook) settle(gone string) (note string, err error) {
	if _, err := os.Stat(b.recordPath()); errors.Is(err, os.ErrNotExist) {
		return "", nil // the common case, without taking the lock
	}
	unlock, err := b.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	rec, err := b.readRecord()
	if err != nil || rec == nil {
		return "", err
	}
	needs := b.needs(gone)
	var keep, drop []string
	for _, a := range rec.Added {
		if needs[a] || slices.Contains(rec.Before, a) {
			if needs[a] {
				keep = append(keep, a)
			}
			continue
		}
		drop = append(drop, a)
	}
	cur, err := readCCList(b.allowed)
	if err != nil {
		return "", err
	}
	next := slices.DeleteFunc(slices.Clone(cur), func(a string) bool { return slices.Contains(drop, a) })
	if len(next) != len(cur) {
		if err := writeCCList(b.allowed, next); err != nil {
			return "", fmt.Errorf("restore net.ipv4.tcp_allowed_congestion_control: %w", err)
		}
	}
	if len(keep) == 0 {
		if err := os.Remove(b.recordPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	} else if len(keep) != len(rec.Added) {
		rec.Added = keep
		if err := b.writeRecord(rec); err != nil {
			return "", err
		}
	}
	if len(next) == len(cur) {
		return "", nil
	}
	what := "restored to"
	if !slices.Equal(next, rec.Before) {
		what = "now" // something else changed it meanwhile: only ours went
	}
	return fmt.Sprintf("net.ipv4.tcp_allowed_congestion_control %s %q (removed %s: no lab uses it)",
		what, strings.Join(next, " "), strings.Join(drop, " ")), nil
}

// needs is the set of HostCC values of the labs with a state directory,
// but gone.
func (b ccBook) needs(gone string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(b.runDir)
	for _, e := range ents {
		if !e.IsDir() || e.Name() == gone {
			continue
		}
		s, err := os.ReadFile(filepath.Join(b.runDir, e.Name(), "lab.json"))
		if err != nil {
			continue
		}
		var st state
		if json.Unmarshal(s, &st) == nil && st.Config.HostCC != "" {
			out[st.Config.HostCC] = true
		}
	}
	return out
}

func (b ccBook) readRecord() (*ccRecord, error) {
	s, err := os.ReadFile(b.recordPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec ccRecord
	if err := json.Unmarshal(s, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w (remove the algorithms labs added from net.ipv4.tcp_allowed_congestion_control by hand, then the file)", b.recordPath(), err)
	}
	return &rec, nil
}

func (b ccBook) writeRecord(rec *ccRecord) error {
	s, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := b.recordPath() + ".tmp"
	if err := os.WriteFile(tmp, append(s, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, b.recordPath())
}

func writeCCList(path string, list []string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(list, " ") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
