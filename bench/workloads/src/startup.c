/*
 * startup: a job's start-up as its user sees it, from the launch to the
 * first exchange with every other rank done: MPI_Init, then one
 * MPI_Alltoall of 8-byte blocks, the first cross-site traffic, which makes
 * the MPI library open its connections (Open MPI and MPICH connect on
 * first use). Users of relays notice connection set-up first.
 *
 * The time starts at --launched-at (the launcher's wall clock, seconds
 * since the epoch: one clock on one machine, as in the lab) or, without
 * it, when the process started; every rank reports its own and the
 * result is the slowest rank's.
 */
#include "wl.h"

#include <stdio.h>

int wl_startup(wl *w)
{
	int n = w->size;
	uint64_t *s = wl_buf(w, 0, n * sizeof *s);
	uint64_t *r = wl_buf(w, 1, n * sizeof *r);
	for (int d = 0; d < n; d++) {
		wl_fill(w, &s[d], sizeof *s, w->rank, d, 0, 0);
		if (d != w->rank)
			wl_count(w, d, sizeof *s);
	}
	MPI_Alltoall(s, 1, MPI_UINT64_T, r, 1, MPI_UINT64_T, w->comm);
	double done = wl_wall();
	for (int d = 0; d < n; d++)
		wl_check(w, &r[d], sizeof *r, d, w->rank, 0, 0);
	double from = w->launched_at > 0 ? w->launched_at : w->started_at;
	w->startup_s = done - from;
	w->init_s = w->inited_at - from;
	return WL_OK;
}
