// The trace ring: interposers on any thread claim and commit 64-byte records
// without a lock (Vyukov's bounded MPMC queue, producer side only); one
// flusher at a time (the Go goroutine, or the destructor at exit) drains it
// into the trace file. A full ring drops the record and counts it, so a slow
// disk never blocks the application.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define RING_N (1u << 16)
#define RING_MASK (RING_N - 1)
#define FLUSH_BATCH 256

struct ring {
	uint64_t head __attribute__((aligned(64)));
	uint64_t tail __attribute__((aligned(64)));
	uint64_t lost, lost_reported, written;
	uint64_t seq[RING_N];
	struct mpi5k_rec rec[RING_N];
};

static struct ring *g_ring;
static int g_trace_fd = -1;
static pthread_mutex_t g_flush_mu = PTHREAD_MUTEX_INITIALIZER;

int mpi5k_ring_init(void) {
	void *r = mmap(NULL, sizeof(struct ring), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED) return 0;
	g_ring = r;
	for (uint64_t i = 0; i < RING_N; i++) g_ring->seq[i] = i;
	return 1;
}

// mpi5k_ring_claim reserves a slot or returns NULL and counts a loss when
// the flusher is behind.
struct mpi5k_rec *mpi5k_ring_claim(uint64_t *posp) {
	struct ring *r = g_ring;
	uint64_t pos = LOADR(&r->head);
	for (;;) {
		uint64_t seq = LOAD(&r->seq[pos & RING_MASK]);
		int64_t d = (int64_t)(seq - pos);
		if (d == 0) {
			if (__atomic_compare_exchange_n(&r->head, &pos, pos + 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
				break;
		} else if (d < 0) {
			__atomic_fetch_add(&r->lost, 1, __ATOMIC_RELAXED);
			return NULL;
		} else {
			pos = LOADR(&r->head);
		}
	}
	*posp = pos;
	return &r->rec[pos & RING_MASK];
}

void mpi5k_ring_commit(uint64_t pos) { STORE(&g_ring->seq[pos & RING_MASK], pos + 1); }

int mpi5k_trace_open(void) { return LOAD(&g_trace_fd) >= 0; }

int mpi5k_trace_detach(void) {
	int fd = LOAD(&g_trace_fd);
	STORE(&g_trace_fd, -1);
	return fd;
}

void mpi5k_set_trace_fd(int fd) { STORE(&g_trace_fd, fd); }

// mpi5k_sleep_ms lets the Go flusher sleep without a Go timer: the first Go
// timer starts the runtime's netpoller, an epoll fd and an eventfd that would
// appear among the host's fds.
void mpi5k_sleep_ms(int ms) {
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void mpi5k_trace_stats(uint64_t *written, uint64_t *lost) {
	*written = g_ring ? LOADR(&g_ring->written) : 0;
	*lost = g_ring ? LOADR(&g_ring->lost) : 0;
}

// write_all goes to the kernel directly: the trace file is the shim's own,
// and neither this library's write() nor another preloaded one may see it.
static int write_all(int fd, const void *p, size_t n) {
	const char *b = p;
	while (n > 0) {
		ssize_t w = syscall(SYS_write, fd, b, n);
		if (w < 0) {
			if (errno == EINTR) continue;
			return -1;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

// mpi5k_trace_flush writes every committed record to the trace file, with a
// lost-records record (MPI5K_REC_LOST) first when records were lost since the last flush. Returns
// the number of records written.
int mpi5k_trace_flush(void) {
	struct ring *r = g_ring;
	int fd = LOAD(&g_trace_fd), total = 0, e = errno;
	if (r == NULL || fd < 0) return 0;
	static struct mpi5k_rec buf[FLUSH_BATCH];
	pthread_mutex_lock(&g_flush_mu);
	for (;;) {
		int n = 0;
		uint64_t lost = LOADR(&r->lost);
		if (lost != r->lost_reported) {
			memset(&buf[n], 0, sizeof buf[n]);
			buf[n].t = mpi5k_now_ns();
			buf[n].kind = MPI5K_REC_LOST;
			buf[n].fd = -1;
			buf[n].ret = (int64_t)(lost - r->lost_reported);
			r->lost_reported = lost;
			n++;
		}
		while (n < FLUSH_BATCH) {
			uint64_t pos = r->tail;
			if (LOAD(&r->seq[pos & RING_MASK]) != pos + 1) break;
			buf[n++] = r->rec[pos & RING_MASK];
			STORE(&r->seq[pos & RING_MASK], pos + RING_N);
			r->tail = pos + 1;
		}
		if (n == 0) break;
		if (write_all(fd, buf, sizeof buf[0] * (size_t)n) != 0) break;
		total += n;
		__atomic_fetch_add(&r->written, (uint64_t)n, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&g_flush_mu);
	errno = e;
	return total;
}
