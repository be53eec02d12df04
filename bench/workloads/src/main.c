/*
 * mpi5k-workload: MPI traffic patterns of the NAS Parallel Benchmarks, as
 * seen on the WAN between two sites, plus a ping-pong.
 *
 *   mpirun -np 4 mpi5k-workload --workload bt [--scale 1] ...
 *
 * Prints human lines and one machine-readable line:
 *   MPI5K-RESULT workload=bt ... time_s=3.210 ... verified=yes
 * Exit status: 0 ok, 1 verification failed, 2 bad usage.
 */
#include "wl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	int (*run)(wl *);
	const char *what;
} workloads[] = {
	{"pingpong", wl_pingpong, "latency/bandwidth, one rank per site"},
	{"bt", wl_bt, "NPB BT: ADI faces, 26 KiB + 160 KiB p2p, 248 ms gaps"},
	{"cg", wl_cg, "NPB CG: 150 KiB p2p with one partner, 75 ms gaps"},
	{"ft", wl_ft, "NPB FT: Alltoall of 2 MiB blocks + tiny Reduce"},
	{"is", wl_is, "NPB IS: Allreduce + Alltoallv of 0.5-0.6 MiB"},
	{"lu", wl_lu, "NPB LU: 1 KiB wavefront pipeline + 200 KiB, 4 ms gaps"},
	{"mg", wl_mg, "NPB MG: V-cycle, 40 B..135 KiB p2p, 26 ms gaps"},
	{"sp", wl_sp, "NPB SP: ADI faces, 45-54 KiB + 100-160 KiB, 145 ms"},
	{"startup", wl_startup, "launch to MPI_Init and a first Alltoall done"},
};
#define NWORKLOADS ((int)(sizeof workloads / sizeof workloads[0]))

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mpirun -np N mpi5k-workload --workload NAME [options]\n"
		"\nworkloads:\n");
	for (int i = 0; i < NWORKLOADS; i++)
		fprintf(f, "  %-9s %s\n", workloads[i].name, workloads[i].what);
	fprintf(f,
		"\noptions:\n"
		"  --scale F          multiply iteration counts (default 1)\n"
		"  --iters N          set the iteration count outright\n"
		"  --compute-scale F  multiply the compute gaps (default 1)\n"
		"  --size-scale F     multiply message sizes (default 1)\n"
		"  --compute work|clock|yield  gaps as calibrated arithmetic\n"
		"                     (default), spinning on MPI_Wtime, or spinning\n"
		"                     on MPI_Wtime with sched_yield()\n"
		"  --loops-per-us F   skip calibration, use this work rate\n"
		"  --launched-at T    startup: the launch's wall clock, seconds\n"
		"                     since the epoch (default: process start)\n"
		"  --sites N          sites; ranks are placed in equal blocks "
		"(default 2)\n"
		"  --min-size B, --max-size B  pingpong sizes (1, 4194304)\n"
		"  --step 2|4         pingpong size factor (default 4)\n"
		"  --reps N           pingpong repetitions per size (default 20)\n"
		"  --warmup N         pingpong untimed repetitions (default 2)\n"
		"  --corrupt          test switch: damage one message on purpose\n"
		"  --verbose          per-iteration progress on rank 0\n");
}

static int parse_double(const char *opt, const char *s, double min,
			double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || v < min) {
		fprintf(stderr, "mpi5k-workload: %s: bad value \"%s\" (want a "
				"number >= %g)\n",
			opt, s, min);
		return 0;
	}
	*out = v;
	return 1;
}

static int parse_long(const char *opt, const char *s, long min, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min) {
		fprintf(stderr, "mpi5k-workload: %s: bad value \"%s\" (want an "
				"integer >= %ld)\n",
			opt, s, min);
		return 0;
	}
	*out = v;
	return 1;
}

/* Returns WL_OK, or WL_USAGE after printing why (rank 0 only prints). */
static int parse_args(wl *w, int argc, char **argv, int loud)
{
	FILE *err = loud ? stderr : fopen("/dev/null", "w");
	int ok = 1;
	for (int i = 1; i < argc && ok; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		long l;
#define NEEDV()                                                               \
	if (!v) {                                                             \
		fprintf(err, "mpi5k-workload: %s needs a value\n", a);        \
		ok = 0;                                                       \
		break;                                                        \
	}                                                                     \
	i++;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			if (loud)
				usage(stdout);
			ok = 0;
		} else if (!strcmp(a, "--workload")) {
			NEEDV();
			w->workload = v;
		} else if (!strcmp(a, "--scale")) {
			NEEDV();
			ok = parse_double(a, v, 1e-9, &w->scale);
		} else if (!strcmp(a, "--compute-scale")) {
			NEEDV();
			ok = parse_double(a, v, 0, &w->compute_scale);
		} else if (!strcmp(a, "--size-scale")) {
			NEEDV();
			ok = parse_double(a, v, 1e-9, &w->size_scale);
		} else if (!strcmp(a, "--iters")) {
			NEEDV();
			ok = parse_long(a, v, 1, &w->iters);
		} else if (!strcmp(a, "--loops-per-us")) {
			NEEDV();
			ok = parse_double(a, v, 1e-9, &w->loops_per_us);
		} else if (!strcmp(a, "--launched-at")) {
			NEEDV();
			ok = parse_double(a, v, 1e-9, &w->launched_at);
		} else if (!strcmp(a, "--compute")) {
			NEEDV();
			if (!strcmp(v, "work"))
				w->compute = WL_COMPUTE_WORK;
			else if (!strcmp(v, "clock"))
				w->compute = WL_COMPUTE_CLOCK;
			else if (!strcmp(v, "yield"))
				w->compute = WL_COMPUTE_YIELD;
			else {
				fprintf(err, "mpi5k-workload: --compute: want "
					     "work, clock or yield, got \"%s\"\n",
					v);
				ok = 0;
			}
		} else if (!strcmp(a, "--sites")) {
			NEEDV();
			if ((ok = parse_long(a, v, 1, &l)))
				w->sites = (int)l;
		} else if (!strcmp(a, "--min-size")) {
			NEEDV();
			if ((ok = parse_long(a, v, 1, &l)))
				w->pp_min = (size_t)l;
		} else if (!strcmp(a, "--max-size")) {
			NEEDV();
			if ((ok = parse_long(a, v, 1, &l)))
				w->pp_max = (size_t)l;
		} else if (!strcmp(a, "--step")) {
			NEEDV();
			if ((ok = parse_long(a, v, 2, &l)))
				w->pp_step = (int)l;
		} else if (!strcmp(a, "--reps")) {
			NEEDV();
			if ((ok = parse_long(a, v, 1, &l)))
				w->pp_reps = (int)l;
		} else if (!strcmp(a, "--warmup")) {
			NEEDV();
			if ((ok = parse_long(a, v, 0, &l)))
				w->pp_warmup = (int)l;
		} else if (!strcmp(a, "--corrupt")) {
			w->corrupt = 1;
		} else if (!strcmp(a, "--verbose")) {
			w->verbose = 1;
		} else {
			fprintf(err, "mpi5k-workload: unknown argument \"%s\" "
				     "(see --help)\n",
				a);
			ok = 0;
		}
#undef NEEDV
	}
	if (ok && !w->workload) {
		fprintf(err, "mpi5k-workload: --workload is required (see "
			     "--help)\n");
		ok = 0;
	}
	if (ok && w->pp_min > w->pp_max) {
		fprintf(err, "mpi5k-workload: --min-size %zu > --max-size %zu\n",
			w->pp_min, w->pp_max);
		ok = 0;
	}
	if (ok && w->pp_max > (size_t)1 << 30) {
		fprintf(err, "mpi5k-workload: --max-size above 1 GiB\n");
		ok = 0;
	}
	if (err != stderr)
		fclose(err);
	return ok ? WL_OK : WL_USAGE;
}

static const char *compute_name(enum wl_compute_mode m)
{
	return m == WL_COMPUTE_WORK ? "work" : m == WL_COMPUTE_CLOCK ? "clock" : "yield";
}

/* Which MPI this is, as one token for the result line. */
static const char *mpi_flavour(void)
{
	static char v[MPI_MAX_LIBRARY_VERSION_STRING];
	int len;
	MPI_Get_library_version(v, &len);
	if (strstr(v, "Open MPI"))
		return "openmpi";
	if (strstr(v, "MPICH"))
		return "mpich";
	return "other";
}

/* One tiny verified message between every pair of ranks before the clock
 * starts, so lazy connection set-up (a WAN round trip or more per pair)
 * is not charged to the first burst of the pattern. */
static void connect_all(wl *w)
{
	const size_t n = 8;
	unsigned char *s = wl_buf(w, 0, n * (size_t)w->size);
	unsigned char *r = wl_buf(w, 1, n * (size_t)w->size);
	int corrupt = w->corrupt;
	w->corrupt = 0; /* the test switch targets the pattern, not this */
	for (int d = 0; d < w->size; d++)
		wl_fill(w, s + n * d, n, w->rank, d, -1, 0);
	MPI_Alltoall(s, (int)n, MPI_BYTE, r, (int)n, MPI_BYTE, w->comm);
	for (int d = 0; d < w->size; d++)
		wl_check(w, r + n * d, n, d, w->rank, -1, 0);
	w->corrupt = corrupt;
}

int main(int argc, char **argv)
{
	double started = wl_wall();
	MPI_Init(&argc, &argv);
	double inited = wl_wall();
	wl w = {
		.started_at = started,
		.inited_at = inited,
		.scale = 1,
		.compute_scale = 1,
		.size_scale = 1,
		.sites = 2,
		.compute = WL_COMPUTE_WORK,
		.pp_min = 1,
		.pp_max = 4 * MiB,
		.pp_step = 4,
		.pp_reps = 20,
		.pp_warmup = 2,
		.comm = MPI_COMM_WORLD,
	};
	MPI_Comm_rank(w.comm, &w.rank);
	MPI_Comm_size(w.comm, &w.size);

	int rc = parse_args(&w, argc, argv, w.rank == 0);
	int (*run)(wl *) = NULL;
	for (int i = 0; rc == WL_OK && i < NWORKLOADS; i++)
		if (!strcmp(w.workload, workloads[i].name))
			run = workloads[i].run;
	if (rc == WL_OK && !run) {
		wl_say(&w, "mpi5k-workload: unknown workload \"%s\" (see "
			   "--help)\n",
		       w.workload);
		rc = WL_USAGE;
	}
	if (rc == WL_OK && (w.size < 2 || w.size % w.sites || w.sites < 2)) {
		wl_say(&w,
		       "mpi5k-workload: need >= 2 sites and a rank count that "
		       "is a multiple of the site count (ranks=%d sites=%d)\n",
		       w.size, w.sites);
		rc = WL_USAGE;
	}
	if (rc != WL_OK) {
		MPI_Finalize();
		return rc;
	}
	w.rps = w.size / w.sites;
	w.site = w.rank / w.rps;
	w.local = w.rank % w.rps;

	const char *mpi = mpi_flavour();
	/* The start-up is timed from the launch, connections and all. */
	int cold = run == wl_startup;
	if (run != wl_pingpong && !cold)
		wl_calibrate(&w);
	if (!cold)
		connect_all(&w);
	wl_say(&w,
	       "mpi5k-workload %s: %d ranks, %d sites x %d, mpi=%s, compute=%s "
	       "loops_per_us=%.1f scale=%g compute_scale=%g size_scale=%g\n",
	       w.workload, w.size, w.sites, w.rps, mpi,
	       compute_name(w.compute), w.loops_per_us,
	       w.scale, w.compute_scale, w.size_scale);

	if (!cold)
		MPI_Barrier(w.comm);
	double t0 = MPI_Wtime();
	rc = run(&w);
	double dt = MPI_Wtime() - t0;
	if (cold && rc == WL_OK) {
		double from = w.launched_at > 0 ? w.launched_at : w.started_at;
		double mine[3] = {w.started_at - from, w.init_s, w.startup_s};
		double most[3];
		MPI_Allreduce(mine, most, 3, MPI_DOUBLE, MPI_MAX, w.comm);
		wl_say(&w, "startup: the processes started %.3f s, MPI_Init "
			   "returned %.3f s and the first Alltoall ended %.3f "
			   "s after the %s (slowest rank)\n",
		       most[0], most[1], most[2],
		       w.launched_at > 0 ? "launch" : "process start");
		dt = w.startup_s;
	}
	if (rc != WL_OK) {
		MPI_Finalize();
		return rc;
	}

	double tmax, cmax;
	uint64_t mine[5] = {w.bytes, w.msgs, w.wan_bytes, w.wan_msgs,
			    (uint64_t)w.failures};
	uint64_t sum[5];
	MPI_Allreduce(&dt, &tmax, 1, MPI_DOUBLE, MPI_MAX, w.comm);
	MPI_Allreduce(&w.compute_s, &cmax, 1, MPI_DOUBLE, MPI_MAX, w.comm);
	MPI_Allreduce(mine, sum, 5, MPI_UINT64_T, MPI_SUM, w.comm);
	int verified = sum[4] == 0;
	wl_say(&w,
	       "%s: %.3f s (compute %.3f s), %.1f MiB in %llu messages, "
	       "inter-site %.1f MiB in %llu, verification %s\n",
	       w.workload, tmax, cmax, (double)sum[0] / MiB,
	       (unsigned long long)sum[1], (double)sum[2] / MiB,
	       (unsigned long long)sum[3],
	       verified ? "ok" : "FAILED");
	wl_say(&w,
	       "MPI5K-RESULT workload=%s mpi=%s ranks=%d sites=%d scale=%g "
	       "compute_scale=%g size_scale=%g compute=%s time_s=%.6f "
	       "compute_s=%.6f bytes=%llu msgs=%llu wan_bytes=%llu "
	       "wan_msgs=%llu failures=%llu loops_per_us=%.3f verified=%s\n",
	       w.workload, mpi, w.size, w.sites, w.scale, w.compute_scale,
	       w.size_scale, compute_name(w.compute),
	       tmax, cmax, (unsigned long long)sum[0],
	       (unsigned long long)sum[1], (unsigned long long)sum[2],
	       (unsigned long long)sum[3], (unsigned long long)sum[4],
	       w.loops_per_us, verified ? "yes" : "no");
	MPI_Barrier(w.comm);
	MPI_Finalize();
	return verified ? WL_OK : WL_VERIFY_FAILED;
}
