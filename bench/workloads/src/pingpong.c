/*
 * pingpong: half-round-trip latency and bandwidth between the first rank of
 * site 0 and the first rank of site 1; other ranks stay idle. Each message
 * is verified outside the timed section: the sender checks the echo after
 * stopping the clock, the echoing rank checks after sending it back (its
 * check overlaps the return trip and the sender's own check and refill).
 */
#include "wl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Fewer repetitions for big messages: their time is transfer-bound and
 * stable, and a slow emulated WAN would otherwise take minutes. */
static int reps_for(const wl *w, size_t size)
{
	long n = w->pp_reps;
	if (size > 64 * KiB) {
		n = (long)((double)n * (double)(64 * KiB) / (double)size);
		if (n < 5)
			n = 5;
		if (n > w->pp_reps)
			n = w->pp_reps;
	}
	n = lround((double)n * w->scale);
	return n < 1 ? 1 : (int)n;
}

int wl_pingpong(wl *w)
{
	const int a = 0, b = w->rps; /* first rank of sites 0 and 1 */
	int sizeidx = 0;
	wl_say(w, "pingpong between rank %d (site 0) and rank %d (site 1)\n", a,
	       b);
	wl_say(w, "%10s %6s %12s %12s %12s\n", "bytes", "reps", "lat_min_us",
	       "lat_med_us", "bw_MB/s");
	for (size_t s = w->pp_min; s <= w->pp_max;
	     s *= (size_t)w->pp_step, sizeidx++) {
		int reps = reps_for(w, s);
		if (w->rank != a && w->rank != b)
			continue;
		unsigned char *sb = wl_buf(w, 0, s);
		unsigned char *rb = wl_buf(w, 1, s + 1);
		double *lat = calloc((size_t)reps, sizeof *lat);
		if (!lat)
			MPI_Abort(w->comm, 3);
		for (int r = -w->pp_warmup; r < reps; r++) {
			long iter = (long)sizeidx * 1000000 + r + w->pp_warmup;
			MPI_Status st;
			int got;
			if (w->rank == a) {
				wl_fill(w, sb, s, a, b, iter, 0);
				double t0 = MPI_Wtime();
				MPI_Send(sb, (int)s, MPI_BYTE, b, 0, w->comm);
				MPI_Recv(rb, (int)s + 1, MPI_BYTE, b, 0, w->comm,
					 &st);
				double t1 = MPI_Wtime();
				wl_count(w, b, s);
				if (r >= 0)
					lat[r] = (t1 - t0) / 2;
			} else {
				MPI_Recv(rb, (int)s + 1, MPI_BYTE, a, 0, w->comm,
					 &st);
				MPI_Get_count(&st, MPI_BYTE, &got);
				MPI_Send(rb, got, MPI_BYTE, a, 0, w->comm);
				wl_count(w, a, (size_t)got);
			}
			MPI_Get_count(&st, MPI_BYTE, &got);
			if ((size_t)got != s)
				wl_fail(w, w->rank == a ? b : a, iter, 0,
					"length expected=%zu got=%d", s, got);
			else
				wl_check(w, rb, s, a, b, iter, 0);
		}
		if (w->rank == a) {
			qsort(lat, (size_t)reps, sizeof *lat, cmp_double);
			double min = lat[0] * 1e6;
			double med = (reps % 2 ? lat[reps / 2]
					       : (lat[reps / 2 - 1] +
						  lat[reps / 2]) / 2) *
				     1e6;
			double bw = (double)s / med; /* bytes/us = MB/s */
			wl_say(w, "%10zu %6d %12.2f %12.2f %12.2f\n", s, reps,
			       min, med, bw);
			wl_say(w,
			       "MPI5K-PINGPONG size=%zu reps=%d lat_us_min=%.3f "
			       "lat_us_med=%.3f bw_MBps=%.6g\n",
			       s, reps, min, med, bw);
		}
		free(lat);
	}
	return WL_OK;
}
