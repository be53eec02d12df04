/*
 * FT: 3-D FFT. Every iteration transposes the whole array with one
 * MPI_Alltoall whose per-pair blocks are 2 MiB (class B: 512x256x256
 * complex over 16 ranks = 2 MiB per pair; ">2 MiB" WAN writes measured),
 * after a long compute phase, then reduces a 16-byte checksum to rank 0
 * (the "<200 B" WAN writes). The measured gap is 4.59 s; it is shortened to
 * 1.2 s here (still far above TCP's idle restart threshold, the RTO, so
 * every transpose still starts from a cold connection in direct mode) to
 * keep a run within seconds.
 */
#include "wl.h"

int wl_ft(wl *w)
{
	const size_t block_base = 2 * MiB;
	const double gap_us = 1200000;
	long iters = wl_iters(w, 4); /* ~4.8 s of compute at scale 1 */
	size_t block = wl_size(w, block_base);
	size_t total = block * (size_t)w->size;
	if (block > (size_t)1 << 30) {
		wl_say(w, "ft: block of %zu B too large for MPI_Alltoall's int "
			  "count\n",
		       block);
		return WL_USAGE;
	}
	unsigned char *s = wl_buf(w, 0, total);
	unsigned char *r = wl_buf(w, 1, total);
	wl_say(w, "ft: %ld iterations: compute %.0f us, Alltoall of %zu B "
		  "blocks, Reduce of 16 B\n",
	       iters, gap_us * w->compute_scale, block);
	for (long it = 0; it < iters; it++) {
		wl_compute(w, gap_us);
		for (int d = 0; d < w->size; d++) {
			wl_fill(w, s + block * d, block, w->rank, d, it, 0);
			if (d != w->rank)
				wl_count(w, d, block);
		}
		MPI_Alltoall(s, (int)block, MPI_BYTE, r, (int)block, MPI_BYTE,
			     w->comm);
		for (int d = 0; d < w->size; d++)
			wl_check(w, r + block * d, block, d, w->rank, it, 0);

		/* Checksum: a complex number per rank, summed at rank 0. */
		double mine[2] = {(double)(w->rank + 1), (double)it}, sum[2];
		MPI_Reduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, 0, w->comm);
		if (w->rank != 0)
			wl_count(w, 0, sizeof mine);
		if (w->rank == 0) {
			double want0 = (double)w->size * (w->size + 1) / 2;
			double want1 = (double)it * w->size;
			if (sum[0] != want0 || sum[1] != want1)
				wl_fail(w, -1, it, 1,
					"reduce expected=(%g,%g) got=(%g,%g)",
					want0, want1, sum[0], sum[1]);
		}
		if (w->verbose)
			wl_say(w, "ft: iteration %ld/%ld done\n", it + 1, iters);
	}
	return WL_OK;
}
