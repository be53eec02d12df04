/*
 * MG: V-cycle multigrid. Each level's comm3 exchanges the faces of that
 * level's grid with the neighbours, so message sizes fall 4x per level
 * (face area) from 135 KiB on the finest grid to 40 B on the coarsest:
 * 7 levels down (restriction) and 7 back up (interpolation) = 14 bursts
 * per cycle, 26 ms apart, with up to 3 partners at the other site (24 WAN
 * connections for 8+8 ranks). Mean size ~26 KiB, as measured (0.19 GiB in
 * 8842 writes = 22 KiB). Each cycle ends with the residual norm, a small
 * Allreduce.
 */
#include "wl.h"

#define LEVELS 7

static void check_norm(wl *w, long cycle)
{
	/* Every rank's contribution is known to all, so the sum is too;
	 * small integers keep the double sum exact in any order. */
	double mine[2] = {w->rank + 1.0 + (double)cycle,
			  (w->rank + 1.0) * (double)(cycle + 1)};
	double sum[2], want[2] = {0, 0};
	MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, w->comm);
	wl_count(w, w->rank, sizeof mine);
	for (int r = 0; r < w->size; r++) {
		want[0] += r + 1.0 + (double)cycle;
		want[1] += (r + 1.0) * (double)(cycle + 1);
	}
	if (sum[0] != want[0] || sum[1] != want[1])
		wl_fail(w, -1, cycle, 0,
			"allreduce expected=(%g,%g) got=(%g,%g)", want[0],
			want[1], sum[0], sum[1]);
}

int wl_mg(wl *w)
{
	const size_t finest = 135 * KiB, coarsest = 40;
	const double gap_us = 26000;
	size_t size[LEVELS];
	int to[WL_MAXPEERS], from[WL_MAXPEERS];
	int k = wl_npartners(w, 3);
	for (int j = 0; j < k; j++) {
		to[j] = wl_remote(w, j, +1);
		from[j] = wl_remote(w, j, -1);
	}
	for (int l = 0; l < LEVELS; l++) {
		size[l] = finest >> (2 * l);
		if (size[l] < coarsest)
			size[l] = coarsest;
	}
	long cycles = wl_iters(w, 10); /* 10 x 14 x 26 ms = 3.6 s at scale 1 */
	wl_say(w, "mg: %ld V-cycles x %d bursts, %zu..%zu B, %d partner(s), "
		  "gap %.0f us\n",
	       cycles, 2 * LEVELS, wl_size(w, size[LEVELS - 1]),
	       wl_size(w, size[0]), k, gap_us * w->compute_scale);
	for (long c = 0; c < cycles; c++) {
		for (int b = 0; b < 2 * LEVELS; b++) {
			int l = b < LEVELS ? b : 2 * LEVELS - 1 - b;
			wl_compute(w, gap_us);
			wl_exchange(w, k, to, from, size[l], size[l],
				    c * 2 * LEVELS + b);
		}
		check_norm(w, c);
		if (w->verbose)
			wl_say(w, "mg: cycle %ld/%ld done\n", c + 1, cycles);
	}
	return WL_OK;
}
