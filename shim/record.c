// Trace records: what the interposers write into the trace ring (ring.c)
// for a traced call (kind MPI5K_REC_CALL) and for a connection as it opens
// (kind MPI5K_REC_CONN). The interposers decide what is traced; this file
// only fills records, so intercept.c keeps the pass-through path alone.
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "_cgo_export.h"

static __thread uint32_t t_tid __attribute__((tls_model("initial-exec")));

// tid is the calling thread's kernel id, asked once per thread.
static inline uint32_t tid(void) {
	if (unlikely(t_tid == 0)) t_tid = (uint32_t)syscall(SYS_gettid);
	return t_tid;
}

void mpi5k_trace_call(int fd, int fn, uint16_t flags, uint64_t t0, int64_t ret, uint64_t req, int err) {
	uint64_t pos, t1 = mpi5k_now_ns();
	struct mpi5k_rec *rc = mpi5k_ring_claim(&pos);
	if (!rc) return;
	uint64_t d = t1 - t0;
	rc->t = t0;
	rc->dur = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
	rc->tid = tid();
	rc->fd = fd;
	rc->kind = MPI5K_REC_CALL;
	rc->fn = (uint8_t)fn;
	rc->flags = flags;
	rc->ret = ret;
	rc->req = req;
	rc->err = ret < 0 ? err : 0;
	rc->resv0 = 0;
	memset(rc->resv1, 0, sizeof rc->resv1);
	mpi5k_ring_commit(pos);
}

static void ep_to_tep(const struct mpi5k_ep *e, struct mpi5k_trace_ep *t) {
	t->family = e->family;
	t->site = e->site;
	t->port = e->port;
	memcpy(t->addr, e->addr, sizeof t->addr);
}

// mpi5k_sample_hook has the Go side take a TCP_INFO sample of a traced TCP
// socket right after it opened (open=1) or right before it closes
// (shim/sample.go). Only once Go opened the trace file: the runtime is up
// then, so the hook never enters Go from a constructor (golang/go#43836).
void mpi5k_sample_hook(int fd, int open) {
	if (!mpi5k_trace_open()) return;
	int e = errno;
	if (open) mpi5kGoSampleOpen(fd);
	else mpi5kGoSampleClose(fd);
	errno = e;
}

void mpi5k_trace_conn(int fd, int fn, uint16_t flags, const struct mpi5k_ep *peer) {
	struct sockaddr_storage ss;
	socklen_t l = sizeof ss;
	struct mpi5k_ep local;
	int e = errno;
	if (getsockname(fd, (struct sockaddr *)&ss, &l) != 0 || !mpi5k_sockaddr_to_ep((struct sockaddr *)&ss, l, &local))
		memset(&local, 0, sizeof local);
	errno = e;
	struct mpi5k_conn_rec c = {
	    .t = mpi5k_now_ns(),
	    .tid = tid(),
	    .fd = fd,
	    .kind = MPI5K_REC_CONN,
	    .fn = (uint8_t)fn,
	    .flags = flags,
	};
	ep_to_tep(&local, &c.local);
	ep_to_tep(peer, &c.peer);
	uint64_t pos;
	struct mpi5k_rec *rc = mpi5k_ring_claim(&pos);
	if (!rc) return;
	memcpy(rc, &c, sizeof c);
	mpi5k_ring_commit(pos);
	mpi5k_sample_hook(fd, 1);
}
