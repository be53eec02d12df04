// Declarations shared by the shim's C files and not by Go. Every function
// here is hidden: the library exports only the interposers and the calls
// Go makes (shim.h), so nothing else can collide with the host's symbols.
#ifndef MPI5K_INTERNAL_H
#define MPI5K_INTERNAL_H

#include <stdint.h>
#include <time.h>

#include "shim.h"

#define HIDDEN __attribute__((visibility("hidden")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define LOAD(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#define LOADR(p) __atomic_load_n(p, __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)

static inline uint64_t mpi5k_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// ring.c: the trace ring the interposers write and the Go flusher drains.
HIDDEN int mpi5k_ring_init(void);
HIDDEN struct mpi5k_rec *mpi5k_ring_claim(uint64_t *pos);
HIDDEN void mpi5k_ring_commit(uint64_t pos);
HIDDEN int mpi5k_trace_open(void);   // the flusher has opened the trace file
HIDDEN int mpi5k_trace_detach(void); // forget the trace fd; returns it to close

// record.c: trace records of a call and of an opening connection; flags
// are the fd's MPI5K_F_RELAYED and MPI5K_F_TRUEPEER.
HIDDEN void mpi5k_trace_call(int fd, int fn, uint16_t flags, uint64_t t0, int64_t ret, uint64_t req, int err);
HIDDEN void mpi5k_trace_conn(int fd, int fn, uint16_t flags, const struct mpi5k_ep *peer);
HIDDEN void mpi5k_sample_hook(int fd, int open); // TCP_INFO sample at open (1) or close (0)

// addr.c: endpoints and sockaddrs (mpi5k_sockaddr_to_ep, which Go calls
// too, is in shim.h).
HIDDEN socklen_t mpi5k_ep_to_sockaddr(const struct mpi5k_ep *ep, int family, struct sockaddr_storage *ss);
HIDDEN int mpi5k_is_local_addr(const struct sockaddr *sa);

// gonote.c: start-up check for a second Go runtime.
HIDDEN int mpi5k_other_go_runtime(void);

#endif
