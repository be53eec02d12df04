package testbed

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testBook is a ccBook over temporary files: a kernel allowing allowed and
// offering available, and an empty run directory.
func testBook(t *testing.T, allowed, available string) ccBook {
	t.Helper()
	dir := t.TempDir()
	b := ccBook{
		allowed:   filepath.Join(dir, "tcp_allowed_congestion_control"),
		available: filepath.Join(dir, "tcp_available_congestion_control"),
		runDir:    filepath.Join(dir, "run"),
	}
	for p, v := range map[string]string{b.allowed: allowed, b.available: available} {
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// labState writes the lab.json of a lab whose hosts use cc.
func (b ccBook) labState(t *testing.T, name, cc string) {
	t.Helper()
	d := filepath.Join(b.runDir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	s, _ := json.Marshal(state{Config: Config{Name: name, HostCC: cc}})
	if err := os.WriteFile(filepath.Join(d, "lab.json"), s, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (b ccBook) labGone(t *testing.T, name string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(b.runDir, name)); err != nil {
		t.Fatal(err)
	}
}

func (b ccBook) list(t *testing.T) string {
	t.Helper()
	l, err := readCCList(b.allowed)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(l, " ")
}

func (b ccBook) mustHold(t *testing.T, lab, cc string) string {
	t.Helper()
	b.labState(t, lab, cc)
	note, err := b.hold(lab, cc)
	if err != nil {
		t.Fatalf("hold %s for %s: %v", cc, lab, err)
	}
	return note
}

func (b ccBook) mustSettle(t *testing.T, gone string) string {
	t.Helper()
	note, err := b.settle(gone)
	if err != nil {
		t.Fatalf("settle (gone %s): %v", gone, err)
	}
	return note
}

func (b ccBook) hasRecord() bool {
	_, err := os.Stat(b.recordPath())
	return err == nil
}

func TestAllowedCCAddAndRestore(t *testing.T) {
	b := testBook(t, "reno bbr", "reno bbr cubic")
	note := b.mustHold(t, "a", "cubic")
	if got := b.list(t); got != "reno bbr cubic" {
		t.Fatalf("allowed list %q after hold, want cubic added", got)
	}
	if !strings.Contains(note, "added cubic") || !strings.Contains(note, `"reno bbr"`) {
		t.Errorf("hold note %q does not say what was added to what", note)
	}
	rec, err := b.readRecord()
	if err != nil || rec == nil || strings.Join(rec.Before, " ") != "reno bbr" || strings.Join(rec.Added, " ") != "cubic" {
		t.Fatalf("record %+v, %v; want before reno bbr, added cubic", rec, err)
	}
	// While lab a is up, settling (another lab's up or down) keeps cubic.
	if note := b.mustSettle(t, "other"); note != "" || b.list(t) != "reno bbr cubic" {
		t.Fatalf("settle with lab a up changed the list to %q (%s)", b.list(t), note)
	}
	b.labGone(t, "a")
	note = b.mustSettle(t, "a")
	if got := b.list(t); got != "reno bbr" {
		t.Fatalf("allowed list %q after lab a went, want reno bbr", got)
	}
	if !strings.Contains(note, `restored to "reno bbr"`) {
		t.Errorf("settle note %q", note)
	}
	if b.hasRecord() {
		t.Error("record left after everything was restored")
	}
	if note := b.mustSettle(t, ""); note != "" {
		t.Errorf("a second settle changed something: %s", note)
	}
}

// Two labs need cubic: it stays until the last one goes, in either order.
func TestAllowedCCReferenceCount(t *testing.T) {
	for _, first := range []string{"a", "b"} {
		b := testBook(t, "reno bbr", "reno bbr cubic")
		b.mustHold(t, "a", "cubic")
		if note := b.mustHold(t, "b", "cubic"); note != "" {
			t.Errorf("second hold changed something: %s", note)
		}
		b.mustHold(t, "c", "bbr") // already allowed: no addition
		second := map[string]string{"a": "b", "b": "a"}[first]
		b.labGone(t, first)
		b.mustSettle(t, first)
		if got := b.list(t); got != "reno bbr cubic" {
			t.Fatalf("lab %s still up, yet the list is %q", second, got)
		}
		// Its down runs while its lab.json is already removed, but a
		// down that settles before removing must not count the lab either.
		b.mustSettle(t, second)
		if got := b.list(t); got != "reno bbr" {
			t.Fatalf("both cubic labs gone, list %q, want reno bbr", got)
		}
		if b.hasRecord() {
			t.Error("record left")
		}
	}
}

// A lab removed without its settling (a crash, or its state directory
// removed by hand) leaves the record; the next settle of any lab restores.
func TestAllowedCCStaleRecord(t *testing.T) {
	b := testBook(t, "reno bbr", "reno bbr cubic")
	b.mustHold(t, "crashed", "cubic")
	b.labGone(t, "crashed")
	b.labState(t, "live", "") // a lab without --host-cc is up
	if note := b.mustSettle(t, ""); !strings.Contains(note, "removed cubic") {
		t.Errorf("settle note %q", note)
	}
	if got := b.list(t); got != "reno bbr" {
		t.Fatalf("list %q after the stale record was settled", got)
	}
	// A crash between the record and the sysctl write: the record names
	// an addition the kernel never saw; settling leaves the list alone.
	if err := b.writeRecord(&ccRecord{Before: []string{"reno", "bbr"}, Added: []string{"cubic"}}); err != nil {
		t.Fatal(err)
	}
	if note := b.mustSettle(t, ""); note != "" || b.list(t) != "reno bbr" || b.hasRecord() {
		t.Errorf("settle of an addition never made: note %q, list %q, record left %v", note, b.list(t), b.hasRecord())
	}
}

// Algorithms in the list before are never removed, and neither is what
// someone else added meanwhile.
func TestAllowedCCNeverRemovesOthers(t *testing.T) {
	b := testBook(t, "reno cubic", "reno bbr cubic htcp")
	if note := b.mustHold(t, "a", "cubic"); note != "" || b.hasRecord() {
		t.Fatalf("hold of an allowed algorithm changed something: %q", note)
	}
	b.labGone(t, "a")
	b.mustSettle(t, "a")
	if got := b.list(t); got != "reno cubic" {
		t.Fatalf("list %q, want reno cubic untouched", got)
	}
	b.mustHold(t, "b", "bbr")
	// Someone allows htcp by hand while lab b is up.
	if err := writeCCList(b.allowed, []string{"reno", "cubic", "bbr", "htcp"}); err != nil {
		t.Fatal(err)
	}
	b.labGone(t, "b")
	note := b.mustSettle(t, "b")
	if got := b.list(t); got != "reno cubic htcp" {
		t.Fatalf("list %q, want only bbr removed", got)
	}
	if !strings.Contains(note, `now "reno cubic htcp"`) {
		t.Errorf("note %q should not claim a restore to the old list", note)
	}
	// A record naming an algorithm of its own Before (a hand-edited or
	// damaged record) does not remove it.
	if err := b.writeRecord(&ccRecord{Before: []string{"reno", "cubic", "htcp"}, Added: []string{"htcp"}}); err != nil {
		t.Fatal(err)
	}
	b.mustSettle(t, "")
	if got := b.list(t); got != "reno cubic htcp" {
		t.Fatalf("list %q: an algorithm of Before was removed", got)
	}
}

func TestAllowedCCCheck(t *testing.T) {
	b := testBook(t, "reno bbr", "reno bbr cubic")
	if note, err := b.check("--host-cc", "cubic"); err != nil || note != "" {
		t.Errorf("check cubic: %q, %v", note, err)
	}
	_, err := b.check("--host-cc", "vegas")
	for _, want := range []string{`host-cc: "vegas" is not available`, "reno bbr cubic", "tcp_vegas", "pick one of reno, bbr, cubic"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check vegas without a loader: %v, want %q", err, want)
		}
	}
	b.load = func(cc string) error { return errors.New("modprobe tcp_" + cc + ": not found") }
	if _, err := b.check("--host-cc", "vegas"); err == nil || !strings.Contains(err.Error(), "modprobe tcp_vegas: not found") {
		t.Errorf("check vegas, module missing: %v", err)
	}
	// A module that loads makes the algorithm available.
	b.load = func(cc string) error {
		return os.WriteFile(b.available, []byte("reno bbr cubic "+cc+"\n"), 0o644)
	}
	note, err := b.check("--host-cc", "vegas")
	if err != nil || !strings.Contains(note, "loaded kernel module tcp_vegas") {
		t.Errorf("check vegas with a loadable module: %q, %v", note, err)
	}
	// A loader that claims success without the algorithm appearing.
	b.load = func(string) error { return nil }
	if _, err := b.check("--host-cc", "hybla"); err == nil || !strings.Contains(err.Error(), "not listed") {
		t.Errorf("check hybla, loader lying: %v", err)
	}
}

// A damaged record stops the bookkeeping with an error naming the file and
// the fix instead of guessing what to remove.
func TestAllowedCCCorruptRecord(t *testing.T) {
	b := testBook(t, "reno bbr cubic", "reno bbr cubic")
	if err := os.MkdirAll(b.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.recordPath(), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := b.settle("")
	if err == nil || !strings.Contains(err.Error(), ccRecordName) || !strings.Contains(err.Error(), "by hand") {
		t.Errorf("settle with a corrupt record: %v", err)
	}
	if got := b.list(t); got != "reno bbr cubic" {
		t.Errorf("list changed to %q", got)
	}
}

// Only the lab's user may open the lock: anyone who can open a file can
// flock it and stall every lab up and down.
func TestAllowedCCLockPrivate(t *testing.T) {
	b := testBook(t, "reno bbr", "reno bbr cubic")
	if err := os.MkdirAll(b.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(b.runDir, "tcp-allowed-cc.lock")
	if err := os.WriteFile(lock, nil, 0o666); err != nil { // left by an older run
		t.Fatal(err)
	}
	b.mustHold(t, "a", "cubic")
	st, err := os.Stat(lock)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("lock file mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
}
