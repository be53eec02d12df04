/*
 * LU: SSOR with a wavefront pipeline. The WAN sees a stream of 1 KiB
 * messages, each after a short compute step (4 ms mean gap), from the
 * upstream half of the job to the downstream half during the lower sweep
 * and back during the upper sweep, plus a 200 KiB boundary exchange per
 * step: 100 small per large message as measured (200000 : 2000), with one
 * partner per rank (8 connections for 8+8 ranks). The pipeline pays the
 * WAN latency once per sweep, not once per message, like the real code.
 */
#include "wl.h"

static void sweep(wl *w, int sender, int peer, long m, double gap_us,
		  size_t size, long base)
{
	for (long k = 0; k < m; k++) {
		if (sender) {
			wl_compute(w, gap_us);
			wl_send(w, peer, size, base + k, 0);
		} else {
			wl_recv(w, peer, size, base + k, 0);
			wl_compute(w, gap_us);
		}
	}
}

int wl_lu(wl *w)
{
	const size_t small = 1 * KiB, large = 200 * KiB;
	const double gap_us = 4000;
	const long m = 100; /* pipeline stages per sweep */
	long steps = wl_iters(w, 5); /* 5 x 2 x 100 x 4 ms = 4 s at scale 1 */
	int peer = wl_partner(w);
	int upstream = w->rank < w->size / 2;
	wl_say(w, "lu: %ld steps x 2 sweeps x %ld messages of %zu B, gap %.0f "
		  "us, then %zu B exchange\n",
	       steps, m, wl_size(w, small), gap_us * w->compute_scale,
	       wl_size(w, large));
	for (long s = 0; s < steps; s++) {
		long base = s * (2 * m + 1);
		sweep(w, upstream, peer, m, gap_us, wl_size(w, small), base);
		sweep(w, !upstream, peer, m, gap_us, wl_size(w, small),
		      base + m);
		wl_exchange(w, 1, &peer, &peer, large, large, base + 2 * m);
		if (w->verbose)
			wl_say(w, "lu: step %ld/%ld done\n", s + 1, steps);
	}
	return WL_OK;
}
