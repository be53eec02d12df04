/*
 * BT and SP: both are ADI solvers on NPB's multipartition decomposition, so
 * they share one communication structure and differ in sizes and gaps.
 *
 * One time step = 8 bursts, each preceded by a compute phase:
 *   copy_faces (2 bursts of large face messages), then for x, y, z:
 *   forward elimination (large) and back substitution (small).
 * That is 5 large : 3 small messages per partner and direction, the ratio
 * measured on the WAN (BT 16112:9648, SP 32112:19248, both 1.67).
 * Each burst exchanges one message with each of up to 4 partners at the
 * other site (BT/SP used 32 WAN connections for 8+8 ranks: 4 per rank).
 */
#include "wl.h"

struct adi {
	const char *name;
	size_t small_lo, small_hi, large_lo, large_hi;
	double gap_us; /* mean gap between bursts on one WAN connection */
	long steps;    /* time steps at scale 1 */
};

/* Large = 1, small = 0, in burst order within a step. */
static const int burst_large[8] = {1, 1, 1, 0, 1, 0, 1, 0};

static int adi_run(wl *w, const struct adi *p)
{
	int to[WL_MAXPEERS], from[WL_MAXPEERS];
	int k = wl_npartners(w, 4);
	for (int j = 0; j < k; j++) {
		to[j] = wl_remote(w, j, +1);
		from[j] = wl_remote(w, j, -1);
	}
	long steps = wl_iters(w, p->steps);
	wl_say(w, "%s: %ld steps x 8 bursts, %d partner(s) per rank, gap %.0f us\n",
	       p->name, steps, k, p->gap_us * w->compute_scale);
	for (long s = 0; s < steps; s++) {
		for (int b = 0; b < 8; b++) {
			long iter = s * 8 + b;
			wl_compute(w, p->gap_us);
			if (burst_large[b])
				wl_exchange(w, k, to, from, p->large_lo,
					    p->large_hi, iter);
			else
				wl_exchange(w, k, to, from, p->small_lo,
					    p->small_hi, iter);
		}
		if (w->verbose)
			wl_say(w, "%s: step %ld/%ld done\n", p->name, s + 1,
			       steps);
	}
	return WL_OK;
}

int wl_bt(wl *w)
{
	/* 2 steps = 16 bursts at 248 ms: ~4 s of compute at scale 1. */
	static const struct adi bt = {"bt", 26 * KiB, 26 * KiB, 160 * KiB,
				      160 * KiB, 248000, 2};
	return adi_run(w, &bt);
}

int wl_sp(wl *w)
{
	/* 4 steps = 32 bursts at 145 ms: ~4.6 s of compute at scale 1. */
	static const struct adi sp = {"sp", 45 * KiB, 54 * KiB, 100 * KiB,
				      160 * KiB, 145000, 4};
	return adi_run(w, &sp);
}
