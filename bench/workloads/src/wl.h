/*
 * mpi5k workloads: shared context and helpers.
 *
 * One program (mpi5k-workload) holds every workload; each lives in its own
 * file and uses only the helpers declared here, so the traffic pattern of a
 * kernel reads top to bottom without verification or accounting noise.
 * Only standard MPI-3 calls are used: the same source builds with Open MPI
 * and MPICH.
 */
#ifndef MPI5K_WL_H
#define MPI5K_WL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* Most partners one burst of wl_exchange talks to. */
#define WL_MAXPEERS 8

/* Exit statuses of the program (every rank returns the same one). */
enum { WL_OK = 0, WL_VERIFY_FAILED = 1, WL_USAGE = 2 };

enum wl_compute_mode {
	WL_COMPUTE_WORK,  /* fixed amount of calibrated arithmetic (default) */
	WL_COMPUTE_CLOCK, /* spin until MPI_Wtime has advanced by the gap */
	WL_COMPUTE_YIELD, /* same, calling sched_yield() while spinning */
};

typedef struct wl {
	/* options */
	const char *workload;
	double scale;         /* multiplies iteration counts */
	double compute_scale; /* multiplies compute gaps */
	double size_scale;    /* multiplies message sizes */
	long iters;           /* > 0: overrides the iteration count */
	int sites;
	int corrupt; /* test switch: damage one message on purpose */
	int verbose;
	enum wl_compute_mode compute;
	double loops_per_us; /* 0: calibrate at start */
	double launched_at;  /* startup: the launch's wall clock, 0 unknown */
	/* pingpong options */
	size_t pp_min, pp_max;
	int pp_step, pp_reps, pp_warmup;

	/* layout: ranks are placed in blocks, rps consecutive ranks per site */
	MPI_Comm comm;
	int rank, size, rps, site, local;

	/* start-up (wl_wall): process start, MPI_Init's return; what the
	 * startup workload measured from the launch (or the start) */
	double started_at, inited_at, startup_s, init_s;

	/* accounting of this rank's logical payload */
	uint64_t bytes, msgs, wan_bytes, wan_msgs;
	double compute_s;

	/* verification */
	long failures;
	int corrupt_done;

	/* scratch buffers, grown on demand */
	void *buf[2 + 2 * WL_MAXPEERS];
	size_t buflen[2 + 2 * WL_MAXPEERS];
} wl;

/* --- layout ------------------------------------------------------------ */
int wl_site_of(const wl *w, int rank);
/* j-th partner at the next site (dir = +1, where this rank sends) or at the
 * previous site (dir = -1, where it receives from); symmetric by
 * construction: if A sends to B as partner j, B receives from A as j. */
int wl_remote(const wl *w, int j, int dir);
/* The rank half a job away: with two sites, the same local index at the
 * other site. */
int wl_partner(const wl *w);
/* Number of remote partners for a kernel wanting `want` of them. */
int wl_npartners(const wl *w, int want);

/* --- scaling ----------------------------------------------------------- */
long wl_iters(const wl *w, long base);
size_t wl_size(const wl *w, size_t base);
/* Size picked deterministically in [lo, hi] for one message, so sender and
 * receiver agree without telling each other. */
size_t wl_size_in(const wl *w, size_t lo, size_t hi, int src, int dst,
		  long iter, int idx);

/* --- compute ----------------------------------------------------------- */
void wl_calibrate(wl *w);
void wl_compute(wl *w, double us);

/* --- payload ----------------------------------------------------------- */
uint64_t wl_seed(int src, int dst, long iter, int idx);
void wl_fill(wl *w, void *buf, size_t n, int src, int dst, long iter, int idx);
/* Returns 1 if buf holds the expected pattern; otherwise prints a
 * "VERIFICATION FAILED" line, counts the failure and returns 0. */
int wl_check(wl *w, const void *buf, size_t n, int src, int dst, long iter,
	     int idx);
/* Reports a failed check that is not a payload comparison (wrong length,
 * wrong reduction result, ...). */
void wl_fail(wl *w, int src, long iter, int idx, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
void wl_count(wl *w, int dst, size_t n);
void *wl_buf(wl *w, int slot, size_t n);

/* --- communication helpers ---------------------------------------------- */
/* Blocking send of a freshly filled message, and the matching receive that
 * verifies length and content. */
void wl_send(wl *w, int dst, size_t n, long iter, int idx);
void wl_recv(wl *w, int src, size_t n, long iter, int idx);
/* One burst: receive from each from[j] and send to each to[j] (tag j)
 * concurrently; every message's size is wl_size_in(lo, hi, ...). */
void wl_exchange(wl *w, int n, const int *to, const int *from, size_t lo,
		 size_t hi, long iter);

/* Wall clock, seconds since the epoch (CLOCK_REALTIME): comparable with
 * the launcher's clock on the same machine. */
double wl_wall(void);

/* --- output ------------------------------------------------------------ */
void wl_say(const wl *w, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* --- workloads: each returns 0 or WL_USAGE after printing why ----------- */
int wl_pingpong(wl *w);
int wl_bt(wl *w);
int wl_sp(wl *w);
int wl_cg(wl *w);
int wl_ft(wl *w);
int wl_is(wl *w);
int wl_lu(wl *w);
int wl_mg(wl *w);
int wl_startup(wl *w);

#endif
