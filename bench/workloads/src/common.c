#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
/* mpi5k workloads: layout, scaling, calibrated compute, payload patterns. */
#include "wl.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- layout ------------------------------------------------------------ */

int wl_site_of(const wl *w, int rank) { return rank / w->rps; }

int wl_remote(const wl *w, int j, int dir)
{
	int site = ((w->site + dir) % w->sites + w->sites) % w->sites;
	int local = ((w->local + dir * j) % w->rps + w->rps) % w->rps;
	return site * w->rps + local;
}

int wl_partner(const wl *w) { return (w->rank + w->size / 2) % w->size; }

int wl_npartners(const wl *w, int want)
{
	int n = want < w->rps ? want : w->rps;
	return n < WL_MAXPEERS ? n : WL_MAXPEERS;
}

/* --- scaling ----------------------------------------------------------- */

long wl_iters(const wl *w, long base)
{
	if (w->iters > 0)
		return w->iters;
	long n = lround((double)base * w->scale);
	return n < 1 ? 1 : n;
}

size_t wl_size(const wl *w, size_t base)
{
	double n = (double)base * w->size_scale;
	return n < 1 ? 1 : (size_t)n;
}

/* splitmix64's finaliser: a cheap, well-mixed 64-bit hash. */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

uint64_t wl_seed(int src, int dst, long iter, int idx)
{
	uint64_t h = mix64(0x6d7069356bULL ^ (uint64_t)(uint32_t)src);
	h = mix64(h ^ ((uint64_t)(uint32_t)dst << 1));
	h = mix64(h ^ (uint64_t)iter);
	return mix64(h ^ (uint64_t)(uint32_t)idx);
}

size_t wl_size_in(const wl *w, size_t lo, size_t hi, int src, int dst,
		  long iter, int idx)
{
	size_t n = lo;
	if (hi > lo)
		n += wl_seed(src, dst, iter, idx ^ 0x5155) % (hi - lo + 1);
	return wl_size(w, n);
}

/* --- compute ----------------------------------------------------------- */

/* Written so the compiler cannot drop the work loop. */
static volatile uint64_t work_sink;

/* A dependent multiply-add chain: no vectorisation, no closed form, one
 * core busy for a time proportional to n. */
static void work(uint64_t n)
{
	uint64_t x = work_sink | 1;
	for (uint64_t i = 0; i < n; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	work_sink = x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void wl_calibrate(wl *w)
{
	if (w->compute != WL_COMPUTE_WORK || w->loops_per_us > 0)
		return;
	/* All ranks measure at the same time, as they compute during a run:
	 * with more ranks than cores the rate seen here is the shared rate
	 * the gaps will run at, so a gap of N us lasts about N us. Each
	 * rank keeps the median of 5 trials of >= 30 ms; the job uses the
	 * mean over ranks. For runs that must do identical work (modes
	 * compared), pass --loops-per-us from an earlier run instead. */
	uint64_t n = 1 << 16;
	for (;;) {
		double t0 = MPI_Wtime();
		work(n);
		double dt = MPI_Wtime() - t0, shortest;
		MPI_Allreduce(&dt, &shortest, 1, MPI_DOUBLE, MPI_MIN, w->comm);
		if (shortest >= 0.03)
			break;
		n *= 2;
	}
	double rate[5];
	for (int t = 0; t < 5; t++) {
		MPI_Barrier(w->comm);
		double t0 = MPI_Wtime();
		work(n);
		rate[t] = (double)n / ((MPI_Wtime() - t0) * 1e6);
	}
	qsort(rate, 5, sizeof rate[0], cmp_double);
	MPI_Allreduce(&rate[2], &w->loops_per_us, 1, MPI_DOUBLE, MPI_SUM,
		      w->comm);
	w->loops_per_us /= w->size;
}

void wl_compute(wl *w, double us)
{
	us *= w->compute_scale;
	if (us <= 0)
		return;
	double t0 = MPI_Wtime();
	if (w->compute == WL_COMPUTE_CLOCK) {
		while ((MPI_Wtime() - t0) * 1e6 < us)
			;
	} else if (w->compute == WL_COMPUTE_YIELD) {
		/* Busy, but hands the core over whenever another process (a
		 * gateway, the WAN emulator) is runnable: on a lab whose "nodes"
		 * share 2 cores this stands for the dedicated cores they would
		 * have, as Open MPI's mpi_yield_when_idle does for waits. */
		while ((MPI_Wtime() - t0) * 1e6 < us)
			sched_yield();
	} else {
		work((uint64_t)(us * w->loops_per_us));
	}
	w->compute_s += MPI_Wtime() - t0;
}

/* --- payload ----------------------------------------------------------- */

/* Word i of a message is mix64(seed + (i+1)*golden): position dependent,
 * so shifted, truncated, stale or swapped data all fail the check. */
static inline uint64_t pattern_word(uint64_t seed, size_t i)
{
	return mix64(seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ULL);
}

void wl_fill(wl *w, void *buf, size_t n, int src, int dst, long iter, int idx)
{
	uint64_t seed = wl_seed(src, dst, iter, idx);
	unsigned char *p = buf;
	size_t words = n / 8;
	for (size_t i = 0; i < words; i++) {
		uint64_t v = pattern_word(seed, i);
		memcpy(p + 8 * i, &v, 8);
	}
	if (n % 8) {
		uint64_t v = pattern_word(seed, words);
		memcpy(p + 8 * words, &v, n % 8);
	}
	if (w->corrupt && !w->corrupt_done && src == 0 && n > 0 &&
	    wl_site_of(w, dst) != wl_site_of(w, src)) {
		p[n / 2] ^= 0x5a;
		w->corrupt_done = 1;
	}
}

int wl_check(wl *w, const void *buf, size_t n, int src, int dst, long iter,
	     int idx)
{
	uint64_t seed = wl_seed(src, dst, iter, idx);
	const unsigned char *p = buf;
	for (size_t off = 0; off < n; off += 8) {
		unsigned char want[8];
		uint64_t v = pattern_word(seed, off / 8);
		size_t len = n - off < 8 ? n - off : 8;
		memcpy(want, &v, 8);
		if (memcmp(p + off, want, len) == 0)
			continue;
		size_t k = 0;
		while (p[off + k] == want[k])
			k++;
		wl_fail(w, src, iter, idx,
			"bytes=%zu offset=%zu expected=0x%02x got=0x%02x", n,
			off + k, want[k], p[off + k]);
		return 0;
	}
	return 1;
}

void wl_fail(wl *w, int src, long iter, int idx, const char *fmt, ...)
{
	w->failures++;
	/* A corrupted stream can fail thousands of checks: the first few
	 * lines tell the story, the count is in the final result. */
	if (w->failures > 5)
		return;
	char detail[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	printf("VERIFICATION FAILED workload=%s rank=%d src=%d iter=%ld msg=%d "
	       "%s\n",
	       w->workload, w->rank, src, iter, idx, detail);
	fflush(stdout);
}

double wl_wall(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void wl_count(wl *w, int dst, size_t n)
{
	w->bytes += n;
	w->msgs++;
	if (wl_site_of(w, dst) != w->site) {
		w->wan_bytes += n;
		w->wan_msgs++;
	}
}

void *wl_buf(wl *w, int slot, size_t n)
{
	if (n == 0)
		n = 1;
	if (w->buflen[slot] < n) {
		free(w->buf[slot]);
		w->buf[slot] = malloc(n);
		if (!w->buf[slot]) {
			fprintf(stderr, "mpi5k-workload: rank %d: out of memory "
					"(%zu bytes)\n",
				w->rank, n);
			MPI_Abort(w->comm, 3);
		}
		w->buflen[slot] = n;
	}
	return w->buf[slot];
}

/* --- communication helpers ---------------------------------------------- */

void wl_send(wl *w, int dst, size_t n, long iter, int idx)
{
	void *b = wl_buf(w, 0, n);
	wl_fill(w, b, n, w->rank, dst, iter, idx);
	MPI_Send(b, (int)n, MPI_BYTE, dst, idx, w->comm);
	wl_count(w, dst, n);
}

/* Checks the received length, then the content. */
static void check_received(wl *w, const void *b, MPI_Status *st, size_t n,
			   int src, long iter, int idx)
{
	int got;
	MPI_Get_count(st, MPI_BYTE, &got);
	if ((size_t)got != n) {
		wl_fail(w, src, iter, idx, "length expected=%zu got=%d", n, got);
		return;
	}
	wl_check(w, b, n, src, w->rank, iter, idx);
}

void wl_recv(wl *w, int src, size_t n, long iter, int idx)
{
	/* One spare byte so a too-long message shows up as a wrong length
	 * rather than an MPI truncation error that aborts the job. */
	void *b = wl_buf(w, 1, n + 1);
	MPI_Status st;
	MPI_Recv(b, (int)n + 1, MPI_BYTE, src, idx, w->comm, &st);
	check_received(w, b, &st, n, src, iter, idx);
}

void wl_exchange(wl *w, int n, const int *to, const int *from, size_t lo,
		 size_t hi, long iter)
{
	MPI_Request req[2 * WL_MAXPEERS];
	MPI_Status st[2 * WL_MAXPEERS];
	size_t rlen[WL_MAXPEERS];
	if (n > WL_MAXPEERS)
		n = WL_MAXPEERS;
	for (int j = 0; j < n; j++) {
		rlen[j] = wl_size_in(w, lo, hi, from[j], w->rank, iter, j);
		void *b = wl_buf(w, 2 + j, rlen[j] + 1);
		MPI_Irecv(b, (int)rlen[j] + 1, MPI_BYTE, from[j], j, w->comm,
			  &req[j]);
	}
	for (int j = 0; j < n; j++) {
		size_t len = wl_size_in(w, lo, hi, w->rank, to[j], iter, j);
		void *b = wl_buf(w, 2 + WL_MAXPEERS + j, len);
		wl_fill(w, b, len, w->rank, to[j], iter, j);
		MPI_Isend(b, (int)len, MPI_BYTE, to[j], j, w->comm, &req[n + j]);
		wl_count(w, to[j], len);
	}
	MPI_Waitall(2 * n, req, st);
	for (int j = 0; j < n; j++)
		check_received(w, w->buf[2 + j], &st[j], rlen[j], from[j], iter,
			       j);
}

/* --- output ------------------------------------------------------------ */

void wl_say(const wl *w, const char *fmt, ...)
{
	if (w->rank != 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}
