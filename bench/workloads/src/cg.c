/*
 * CG: conjugate gradient on a 2-D process grid. The WAN sees only the
 * exchanges of 150 KiB vector segments with one partner per rank (8
 * connections for 8+8 ranks); the dot-product reductions stay in a site.
 * One burst = the matrix-vector product's dependent exchanges (reduction
 * steps across the row, then the transpose partner): 3 exchanges back to
 * back, ~6 WAN writes per burst and connection as measured. Bursts are
 * 75 ms apart. 30 bursts: behind competing traffic each dependent exchange
 * can cost an RTO, and 50 bursts took 70 s on a 20 ms lab.
 */
#include "wl.h"

int wl_cg(wl *w)
{
	const size_t size = 150 * KiB;
	const double gap_us = 75000;
	const int per_burst = 3;
	long bursts = wl_iters(w, 30); /* 2.25 s of compute at scale 1 */
	int peer = wl_partner(w);
	wl_say(w, "cg: %ld bursts x %d exchanges of %zu B with the rank "
		  "half a job away, gap %.0f us\n",
	       bursts, per_burst, wl_size(w, size), gap_us * w->compute_scale);
	for (long b = 0; b < bursts; b++) {
		wl_compute(w, gap_us);
		for (int e = 0; e < per_burst; e++)
			wl_exchange(w, 1, &peer, &peer, size, size,
				    b * per_burst + e);
		if (w->verbose && (b + 1) % 10 == 0)
			wl_say(w, "cg: burst %ld/%ld done\n", b + 1, bursts);
	}
	return WL_OK;
}
