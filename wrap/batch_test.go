package wrap

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestSrunFlavourAndHosts(t *testing.T) {
	if f, err := DetectFlavour("/usr/bin/srun"); err != nil || f != Slurm {
		t.Fatalf("srun: %v %v", f, err)
	}
	if f, err := ParseFlavour("slurm"); err != nil || f != Slurm {
		t.Fatalf("--flavour slurm: %v %v", f, err)
	}
	hs, src, err := HostsFromArgs(Slurm, []string{"srun", "-x", "gw9", "-n", "4", "-w", "node[1-2],gw1", "./app"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Host{{"node1", 0}, {"node2", 0}, {"gw1", 0}}; !reflect.DeepEqual(hs, want) || len(src) != 1 || src[0].Option != "-w" {
		t.Errorf("srun -x gw9 -w node[1-2],gw1: hosts %v from %v, want %v from -w (-x is --exclude)", hs, src, want)
	}
}

func TestSrunInject(t *testing.T) {
	in := Inject{Preload: "/opt/mpi5k/libmpi5k.so", Map: "/w/sites.conf", Env: map[string]string{"MPI5K_TRACE": "/tmp/tr"}}
	none := func(string) string { return "" }
	got, err := in.Command(Slurm, []string{"srun", "-n", "4", "./app", "-x", "1"}, none)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"srun", "--export=ALL,LD_PRELOAD=/opt/mpi5k/libmpi5k.so,MPI5K_MAP=/w/sites.conf,GODEBUG=asyncpreemptoff=1,MPI5K_TRACE=/tmp/tr", "-n", "4", "./app", "-x", "1"}
	if !slices.Equal(got, want) {
		t.Errorf("srun command:\n%q\nwant\n%q", got, want)
	}
	// The user's --export keeps its choice and gets ours appended (srun
	// takes the last --export only).
	for _, tc := range []struct{ in, want []string }{
		{[]string{"srun", "--export=NONE,HOME", "./app"}, []string{"srun", "--export=NONE,HOME,LD_PRELOAD="}},
		{[]string{"srun", "--export", "ALL", "./app"}, []string{"srun", "--export", "ALL,LD_PRELOAD="}},
	} {
		got, err := in.Command(Slurm, tc.in, none)
		if err != nil || len(got) != len(tc.in) || !strings.HasPrefix(strings.Join(got, " "), strings.Join(tc.want, " ")) {
			t.Errorf("%q -> %q, %v; want it to start %q", tc.in, got, err, tc.want)
		}
	}
	_, err = in.Command(Slurm, []string{"srun", "./app"}, func(k string) string { return map[string]string{"GODEBUG": "madvdontneed=1"}[k] })
	if err == nil || !strings.Contains(err.Error(), "GODEBUG=") || !strings.Contains(err.Error(), "comma") {
		t.Errorf("a value with a comma: %v, want a refusal naming GODEBUG", err)
	}
}

func TestSrunDedicated(t *testing.T) {
	got, err := WithoutHosts(Slurm, []string{"srun", "-n", "2", "./app"}, []Host{{"n1", 0}, {"n2", 0}, {"gw", 0}},
		[]HostSource{{Option: "$SLURM_JOB_NODELIST", ArgIdx: -1}}, map[string]bool{"gw": true}, t.TempDir())
	if err != nil || !slices.Equal(got, []string{"srun", "--exclude=gw", "-n", "2", "./app"}) {
		t.Errorf("srun --dedicated-gateways: %q %v", got, err)
	}
}

// A plain mpirun under OAR gets the node file; a dry run shows it.
func TestRunPassesOARNodefile(t *testing.T) {
	nodefile := writeFile(t, t.TempDir(), "oar", "node-1.site1\nnode-1.site1\nnode-1.site2\nnode-1.site2\n")
	for _, tc := range []struct{ launcher, opt string }{{"mpirun.openmpi", "--hostfile"}, {"mpiexec.mpich", "-f"}} {
		c, out, errb := testConfig(t, tc.launcher, "-np", "4", "./app")
		c.DryRun = true
		c.Getenv = func(k string) string {
			return map[string]string{"OAR_NODEFILE": nodefile, "MPI5K_GATEWAYS": "site1=gw.site1,site2=gw.site2"}[k]
		}
		if code, err := Run(context.Background(), c); code != 0 || err != nil {
			t.Fatal(code, err)
		}
		if want := " " + tc.opt + " " + nodefile + " -np 4 ./app\n"; !strings.Contains(out.String(), want) {
			t.Errorf("%s under OAR: mpirun line lacks %q:\n%s", tc.launcher, want, out.String())
		}
		if !strings.Contains(errb.String(), "$OAR_NODEFILE names the hosts: passing it to "+tc.launcher+" as "+tc.opt) {
			t.Errorf("no note on the node file:\n%s", errb.String())
		}
	}
}

func TestRunTraceDryRun(t *testing.T) {
	c, out, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,node-1.site2", "-n", "2", "./pp")
	c.DryRun, c.SharedFS, c.TraceDir = true, false, "/tmp/my traces"
	if code, err := Run(context.Background(), c); code != 0 || err != nil {
		t.Fatal(code, err)
	}
	for _, want := range []string{
		"ssh node-1.site2 'mkdir -p '\\''/tmp/my traces'\\'''\n",
		"ssh node-1.site1 'cd '\\''/tmp/my traces'\\'' && find . -maxdepth 1 -name '\\''*.trace'\\'' -type f -print0 | tar -cf - --null -T -'\n",
		"-genv MPI5K_TRACE '/tmp/my traces'",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUntarTraces(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range []struct {
		name string
		typ  byte
		body string
	}{{"./a.1.trace", tar.TypeReg, "AAA"}, {"../../evil.trace", tar.TypeReg, "E"}, {"notes.txt", tar.TypeReg, "x"}, {"d.trace", tar.TypeDir, ""}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: f.typ, Size: int64(len(f.body)), Mode: 0o644})
		tw.Write([]byte(f.body))
	}
	tw.Close()
	dir := t.TempDir()
	n, err := untarTraces(&b, dir)
	if err != nil || n != 2 {
		t.Fatalf("%d files, %v; want 2", n, err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"a.1.trace", "evil.trace"}) {
		t.Errorf("wrote %v", names)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "a.1.trace")); string(got) != "AAA" {
		t.Errorf("a.1.trace holds %q", got)
	}
}

func TestWithOarsh(t *testing.T) {
	none := func(string) string { return "" }
	oarsh := []string{"oarsh"}
	for _, tc := range []struct {
		f        Flavour
		argv     []string
		launcher []string
		want     []string
	}{
		{OpenMPI, []string{"mpirun", "-np", "4", "./a"}, oarsh, []string{"mpirun", "--mca", "plm_rsh_agent", "oarsh", "-np", "4", "./a"}},
		{OpenMPI, []string{"mpirun", "--mca", "plm_rsh_agent", "ssh", "./a"}, oarsh, []string{"mpirun", "--mca", "plm_rsh_agent", "ssh", "./a"}},
		{Hydra, []string{"mpiexec", "-n", "2", "./a"}, []string{"/usr/bin/oarsh"}, []string{"mpiexec", "-launcher", "ssh", "-launcher-exec", "/usr/bin/oarsh", "-n", "2", "./a"}},
		{Hydra, []string{"mpiexec", "-launcher", "rsh", "./a"}, oarsh, []string{"mpiexec", "-launcher", "rsh", "./a"}},
		{OpenMPI, []string{"mpirun", "./a"}, []string{"ssh"}, []string{"mpirun", "./a"}},
		{Slurm, []string{"srun", "./a"}, oarsh, []string{"srun", "./a"}},
	} {
		got, _ := withOarsh(tc.f, tc.argv, tc.launcher, none)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v %q with --launcher %q: %q, want %q", tc.f, tc.argv, tc.launcher, got, tc.want)
		}
	}
	got, _ := withOarsh(OpenMPI, []string{"mpirun", "./a"}, oarsh, func(k string) string { return map[string]string{"OMPI_MCA_plm_rsh_agent": "x"}[k] })
	if !slices.Equal(got, []string{"mpirun", "./a"}) {
		t.Errorf("with $OMPI_MCA_plm_rsh_agent set: %q", got)
	}
}

func TestNoHostsNamesBatchSystems(t *testing.T) {
	want := "no host list: the command has no hostfile/host option and no batch system ($OAR_NODEFILE, $PBS_NODEFILE, $SLURM_JOB_NODELIST) is set"
	if got := errNoHosts().Error(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
