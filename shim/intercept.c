// The C interception layer of libmpi5k.so.
//
// Every interposed libc function starts here. The pass-through path (an fd the
// shim does not manage, tracing off) is a load, a branch and a call through a
// pointer resolved once with dlsym(RTLD_NEXT): it never enters Go, because a
// C->Go call costs ~50 ns and, worse, must never happen in a forked child.
// Go is entered only to decide and perform a relayed connect, to ask the
// gateway who stands behind an accepted connection, to tell it of a port
// the process listens on (listen() is rare), and (through its own
// goroutine) to flush trace records that C wrote into a lock-free ring.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "_cgo_export.h"

// ---- real libc functions --------------------------------------------------

typedef int (*socket_fn)(int, int, int);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*getpeername_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*close_fn)(int);
typedef int (*dup_fn)(int);
typedef int (*dup2_fn)(int, int);
typedef int (*dup3_fn)(int, int, int);
typedef int (*fcntl_fn)(int, int, ...);
typedef int (*close_range_fn)(unsigned, unsigned, int);
typedef void (*closefrom_fn)(int);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);
typedef ssize_t (*read_chk_fn)(int, void *, size_t, size_t);
typedef ssize_t (*recv_chk_fn)(int, void *, size_t, size_t, int);
typedef ssize_t (*recvfrom_chk_fn)(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

// Every libc function the shim calls on to: its name, then its pointer's
// type. fcntl64 is glibc's name for fcntl in programs built with
// _FILE_OFFSET_BITS=64; the _chk variants are what _FORTIFY_SOURCE builds
// call.
#define REALS(X)                                                                                   \
	X(socket, socket_fn) X(connect, connect_fn) X(listen, listen_fn) X(accept, accept_fn)      \
	X(accept4, accept4_fn) X(getpeername, getpeername_fn) X(close, close_fn) X(dup, dup_fn)    \
	X(dup2, dup2_fn) X(dup3, dup3_fn) X(fcntl, fcntl_fn) X(fcntl64, fcntl_fn)                  \
	X(close_range, close_range_fn) X(closefrom, closefrom_fn) X(read, read_fn)                 \
	X(write, write_fn) X(readv, readv_fn) X(writev, writev_fn) X(send, send_fn)                \
	X(sendto, sendto_fn) X(sendmsg, sendmsg_fn) X(recv, recv_fn) X(recvfrom, recvfrom_fn)      \
	X(recvmsg, recvmsg_fn) X(__read_chk, read_chk_fn) X(__recv_chk, recv_chk_fn)               \
	X(__recvfrom_chk, recvfrom_chk_fn)

#define DECL(n, t) static t real_##n;
REALS(DECL)

// resolve may run in two threads at once before the constructor; both store
// the same pointers, so the race is benign.
static void resolve(void) {
#define RES(n, t) real_##n = (t)dlsym(RTLD_NEXT, #n);
	REALS(RES)
	if (!real_fcntl64) real_fcntl64 = real_fcntl; // glibc before 2.28
}

#define REAL(n) (__builtin_expect(real_##n != NULL, 1) ? real_##n : (resolve(), real_##n))

// ---- process state --------------------------------------------------------

static int g_enabled;          // MPI5K_MAP set, not setuid, no other Go runtime
static int g_go_ok;            // Go may be entered (cleared in a forked child)
static int g_cfg;              // 0 not asked yet, 1 active, 2 Go said inactive
static int g_tracing;          // record data calls
static int g_trace_wanted;     // MPI5K_TRACE was set at start
static int g_allow_loopback;   // MPI5K_TEST_ALLOW_LOOPBACK=1 (tests only)
static pthread_mutex_t g_cfg_mu = PTHREAD_MUTEX_INITIALIZER;

#define MAX_GW 32
static struct mpi5k_ep g_gw[MAX_GW]; // local site gateway LAN addresses
static int g_ngw;

// fd table: one flag byte per fd and the endpoint an intercepted
// getpeername() reports. Reserved lazily by the kernel (MAP_NORESERVE): only
// the pages of fds actually used cost memory.
#define FD_MAX (1 << 20)
static uint8_t *g_flags;
static struct mpi5k_ep *g_peer;
static int g_fd_hi; // highest fd ever flagged, bounds close_range clearing

static inline int fd_ok(int fd) { return g_flags != NULL && (unsigned)fd < FD_MAX; }

static inline void fd_hi(int fd) {
	int h = LOADR(&g_fd_hi);
	while (fd > h && !__atomic_compare_exchange_n(&g_fd_hi, &h, fd, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static inline void fd_clear(int fd) {
	if (fd_ok(fd) && LOADR(&g_flags[fd])) STORE(&g_flags[fd], 0);
}

// fd_copy makes newfd describe the same socket as oldfd (dup family).
static inline void fd_copy(int oldfd, int newfd) {
	if (!fd_ok(newfd)) return;
	uint8_t f = fd_ok(oldfd) ? LOAD(&g_flags[oldfd]) : 0;
	if (f & (MPI5K_F_RELAYED | MPI5K_F_TRUEPEER)) g_peer[newfd] = g_peer[oldfd];
	if (f) fd_hi(newfd);
	STORE(&g_flags[newfd], f);
}

int mpi5k_fd_flags(int fd) { return fd_ok(fd) ? LOAD(&g_flags[fd]) : -1; }
int mpi5k_enabled(void) { return g_enabled && LOADR(&g_go_ok); }
int mpi5k_trace_wanted(void) { return g_trace_wanted && LOADR(&g_tracing); }
int mpi5k_allow_loopback(void) { return g_allow_loopback; }

void mpi5k_set_gateways(const struct mpi5k_ep *eps, int n) {
	if (n > MAX_GW) n = MAX_GW;
	memcpy(g_gw, eps, sizeof(*eps) * (size_t)n);
	g_ngw = n;
}

// ---- addresses (conversions in addr.c) -------------------------------------

// copy_out fills a caller's (addr, *len) pair with accept/getpeername semantics:
// truncate to the caller's buffer, report the full length.
static void copy_out(struct sockaddr *addr, socklen_t *lenp, const void *src, socklen_t n) {
	if (addr == NULL || lenp == NULL) return;
	socklen_t c = *lenp < n ? *lenp : n;
	memcpy(addr, src, c);
	*lenp = n;
}

static int is_gateway(const struct mpi5k_ep *ep) {
	for (int i = 0; i < g_ngw; i++)
		if (g_gw[i].family == ep->family && !memcmp(g_gw[i].addr, ep->addr, ep->family == 4 ? 4 : 16))
			return 1;
	return 0;
}

// ---- configuration from Go ------------------------------------------------

// cfg_active asks Go once whether this process relays (map loaded, local site
// known). Returns 1 when relaying is on. Never called in a forked child, nor
// from a constructor: it is first needed by a connect/accept, and a Go call
// made while the loader still runs constructors can deadlock waiting for the
// runtime's start-up (golang/go#43836).
static int cfg_active(void) {
	int c = LOAD(&g_cfg);
	if (likely(c != 0)) return c == 1;
	if (!g_enabled || !LOADR(&g_go_ok)) return 0;
	int e = errno;
	pthread_mutex_lock(&g_cfg_mu);
	c = LOAD(&g_cfg);
	if (c == 0) {
		c = mpi5kGoInit() ? 1 : 2;
		STORE(&g_cfg, c);
	}
	pthread_mutex_unlock(&g_cfg_mu);
	errno = e;
	return c == 1;
}

// ---- tracing: which fds are traced; records are filled in record.c --------

// trace_flags is what a record says of fd: relayed, or accepted with its
// true peer.
static inline uint16_t trace_flags(int fd) {
	return fd_ok(fd) ? (LOADR(&g_flags[fd]) & (MPI5K_F_RELAYED | MPI5K_F_TRUEPEER)) : 0;
}

static inline void trace_call(int fd, int fn, uint64_t t0, int64_t ret, uint64_t req, int err) {
	mpi5k_trace_call(fd, fn, trace_flags(fd), t0, ret, req, err);
}

static inline void trace_conn(int fd, int fn, const struct mpi5k_ep *peer) {
	mpi5k_trace_conn(fd, fn, trace_flags(fd), peer);
}

// classify looks once per fd at whether it is a TCP socket; the answer is
// cached in the fd table until close/dup clears it.
static uint8_t classify(int fd) {
	int e = errno, proto = 0;
	socklen_t l = sizeof proto;
	uint8_t add = MPI5K_F_KNOWN;
	if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 && proto == IPPROTO_TCP) add |= MPI5K_F_TCP;
	errno = e;
	fd_hi(fd);
	return __atomic_or_fetch(&g_flags[fd], add, __ATOMIC_RELAXED);
}

static inline int traced(int fd) {
	if (!fd_ok(fd)) return 0;
	uint8_t f = LOADR(&g_flags[fd]);
	if (unlikely(!(f & MPI5K_F_KNOWN))) f = classify(fd);
	return f & MPI5K_F_TCP;
}

// ---- fork ---------------------------------------------------------------

// A child forked without exec has only the forking thread; Go's scheduler
// threads are gone and entering Go there can hang forever (golang/go#15538,
// golang/go#14767, golang/go#53806: only fork+exec is supported; measured
// here: children hang without this handler, 100/100 with it). So the child
// never enters Go: connects
// pass through directly and tracing stops (its ring belongs to the parent's
// flusher). After exec the new image loads a fresh copy of the shim.
static void atfork_child(void) {
	STORE(&g_go_ok, 0);
	STORE(&g_tracing, 0);
	int fd = mpi5k_trace_detach();
	if (fd >= 0) REAL(close)(fd);
}

// ---- start-up checks ------------------------------------------------------

// fix_godebug adds asyncpreemptoff=1 to an existing GODEBUG variable in
// place. Go's runtime in a c-shared library reads the environment from the
// original envp array later, on its own start-up thread; a new variable
// added with setenv() lands in a new array it never sees, but replacing the
// pointer of an existing slot is seen. Without GODEBUG in the environment the
// launcher must set it (docs/shim.md): //go:debug cannot set this one.
#define GODEBUG_EQ "GODEBUG="
static void fix_godebug(void) {
	extern char **environ;
	const size_t k = sizeof GODEBUG_EQ - 1;
	for (char **e = environ; e && *e; e++) {
		if (strncmp(*e, GODEBUG_EQ, k) != 0) continue;
		if (strstr(*e, "asyncpreemptoff=")) return;
		size_t n = strlen(*e) + sizeof ",asyncpreemptoff=1";
		char *s = malloc(n);
		if (!s) return;
		snprintf(s, n, "%s%sasyncpreemptoff=1", *e, (*e)[k] ? "," : ""); // a comma after a value
		*e = s; // leaked on purpose: the environment keeps pointing to it
		return;
	}
}

static int env_on(const char *name) {
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0;
}

// Priority 101 runs before the Go runtime's own initializer in this library
// (plain .init_array entries sort after prioritized ones), so GODEBUG is fixed
// before the runtime reads it.
__attribute__((constructor(101))) static void mpi5k_ctor(void) {
	resolve();
	STORE(&g_go_ok, 1);
	if (getauxval(AT_SECURE)) return; // setuid/setgid: never act
	// Another Go runtime's GODEBUG is not ours to change.
	if (mpi5k_other_go_runtime()) return;
	// Even a passive shim starts a Go runtime, whose preemption signals
	// (seen at start-up) must not reach the host.
	fix_godebug();
	const char *map = getenv("MPI5K_MAP");
	if (!map || !*map) return; // no map: pure pass-through
	// Open MPI's TCP BTL binds its listener from btl_tcp_port_min_v4 up
	// (1024 by default), among the node's services, where the gateways
	// register no rank's port: they take only --lan-listen-ports, Linux's
	// ephemeral range by default (docs/security.md). Start it there; a
	// value the job sets (mpirun --mca, the environment) is kept.
	setenv("OMPI_MCA_btl_tcp_port_min_v4", "32768", 0);
	setenv("OMPI_MCA_btl_tcp_port_min_v6", "32768", 0);
	g_allow_loopback = env_on("MPI5K_TEST_ALLOW_LOOPBACK");
	void *f = mmap(NULL, FD_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *p = mmap(NULL, sizeof(struct mpi5k_ep) * FD_MAX, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (f == MAP_FAILED || p == MAP_FAILED) return;
	g_peer = p;
	const char *tr = getenv("MPI5K_TRACE");
	if (tr && *tr && mpi5k_ring_init()) g_trace_wanted = 1;
	pthread_atfork(NULL, NULL, atfork_child);
	g_flags = f;
	g_enabled = 1;
	if (g_trace_wanted) STORE(&g_tracing, 1);
}

__attribute__((destructor)) static void mpi5k_dtor(void) {
	if (LOADR(&g_tracing)) mpi5k_trace_flush();
}

// ---- connect / accept / getpeername ----------------------------------------

enum { FN_READ = 1, FN_WRITE, FN_READV, FN_WRITEV, FN_SEND, FN_SENDTO, FN_SENDMSG, FN_RECV,
       FN_RECVFROM, FN_RECVMSG, FN_CONNECT, FN_ACCEPT, FN_ACCEPT4, FN_CLOSE };

static int want_relay(int fd, const struct sockaddr *sa, socklen_t len) {
	if (!g_enabled || !LOADR(&g_go_ok) || sa == NULL) return 0;
	if (sa->sa_family == AF_INET) {
		if (len < (socklen_t)sizeof(struct sockaddr_in)) return 0;
	} else if (sa->sa_family == AF_INET6) {
		if (len < (socklen_t)sizeof(struct sockaddr_in6)) return 0;
	} else {
		return 0;
	}
	if (!g_allow_loopback && mpi5k_is_local_addr(sa)) return 0;
	int e = errno, type = 0;
	socklen_t l = sizeof type;
	int r = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l);
	errno = e;
	if (r != 0 || type != SOCK_STREAM) return 0;
	return cfg_active();
}

int connect(int fd, const struct sockaddr *sa, socklen_t len) {
	if (want_relay(fd, sa, len)) {
		if (fd_ok(fd) && (LOAD(&g_flags[fd]) & MPI5K_F_RELAYED)) {
			errno = EISCONN; // a second connect() after EINPROGRESS: it is connected
			return -1;
		}
		int e = errno;
		uint64_t t0 = mpi5k_now_ns();
		int r = mpi5kGoConnect(fd, (struct sockaddr *)sa, len);
		if (r == MPI5K_RELAYED || r == MPI5K_RELAYED_NB) {
			struct mpi5k_ep dst;
			mpi5k_sockaddr_to_ep(sa, len, &dst);
			if (fd_ok(fd)) {
				g_peer[fd] = dst;
				fd_hi(fd);
				STORE(&g_flags[fd], MPI5K_F_RELAYED | MPI5K_F_KNOWN | MPI5K_F_TCP);
			}
			int ret = r == MPI5K_RELAYED ? 0 : -1;
			if (LOADR(&g_tracing)) {
				trace_call(fd, FN_CONNECT, t0, ret, 0, EINPROGRESS);
				trace_conn(fd, FN_CONNECT, &dst);
			}
			// A non-blocking socket reports EINPROGRESS even though it is
			// already connected: that is what Linux itself answers for a
			// loopback connect, the path applications test most; POLLOUT and
			// SO_ERROR=0 follow at once.
			errno = r == MPI5K_RELAYED ? e : EINPROGRESS;
			return ret;
		}
		if (r < 0) {
			errno = -r;
			return -1;
		}
		errno = e; // MPI5K_PASS: same site, unknown, or fallback direct
	}
	if (likely(!LOADR(&g_tracing))) return REAL(connect)(fd, sa, len);
	fd_clear(fd); // connect on a reused fd number: classify again
	uint64_t t0 = mpi5k_now_ns();
	int r = REAL(connect)(fd, sa, len);
	int e = errno;
	if (traced(fd)) {
		trace_call(fd, FN_CONNECT, t0, r, 0, e);
		struct mpi5k_ep peer;
		if ((r == 0 || e == EINPROGRESS) && mpi5k_sockaddr_to_ep(sa, len, &peer)) trace_conn(fd, FN_CONNECT, &peer);
	}
	errno = e;
	return r;
}

static int do_accept(int fd, struct sockaddr *addr, socklen_t *lenp, int flags, int fn) {
	int active = g_enabled && LOADR(&g_go_ok) && (cfg_active() || LOADR(&g_tracing));
	if (!active) {
		return fn == FN_ACCEPT ? REAL(accept)(fd, addr, lenp) : REAL(accept4)(fd, addr, lenp, flags);
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	uint64_t t0 = mpi5k_now_ns();
	int nfd = fn == FN_ACCEPT ? REAL(accept)(fd, (struct sockaddr *)&ss, &sl)
	                          : REAL(accept4)(fd, (struct sockaddr *)&ss, &sl, flags);
	int e = errno;
	if (nfd < 0) {
		if (LOADR(&g_tracing) && traced(fd)) trace_call(fd, fn, t0, nfd, 0, e);
		errno = e;
		return nfd;
	}
	fd_clear(nfd);
	struct mpi5k_ep seen, truep;
	int have = mpi5k_sockaddr_to_ep((struct sockaddr *)&ss, sl, &seen);
	truep = seen;
	if (have && LOAD(&g_cfg) == 1 && is_gateway(&seen) && LOADR(&g_go_ok)) {
		if (mpi5kGoPeerQuery(nfd, &seen, &truep) == 1 && fd_ok(nfd)) {
			g_peer[nfd] = truep;
			fd_hi(nfd);
			STORE(&g_flags[nfd], MPI5K_F_TRUEPEER | MPI5K_F_KNOWN | MPI5K_F_TCP);
			struct sockaddr_storage out;
			socklen_t ol = mpi5k_ep_to_sockaddr(&truep, ss.ss_family, &out);
			ss = out;
			sl = ol;
		} else {
			truep = seen;
		}
	}
	copy_out(addr, lenp, &ss, sl);
	if (LOADR(&g_tracing) && traced(nfd)) {
		trace_call(fd, fn, t0, nfd, 0, 0);
		if (have) trace_conn(nfd, fn, &truep);
	}
	errno = e;
	return nfd;
}

// listen registers a listening TCP port with the site gateway, which lets
// streams from other sites reach only such ports (shim/listen.go); the
// socket listens whatever the registration's outcome.
int listen(int fd, int backlog) {
	int r = REAL(listen)(fd, backlog);
	if (r != 0 || !g_enabled || !LOADR(&g_go_ok)) return r;
	int e = errno;
	if (cfg_active()) mpi5kGoListen(fd);
	errno = e;
	return r;
}

int accept(int fd, struct sockaddr *addr, socklen_t *lenp) { return do_accept(fd, addr, lenp, 0, FN_ACCEPT); }
int accept4(int fd, struct sockaddr *addr, socklen_t *lenp, int flags) {
	return do_accept(fd, addr, lenp, flags, FN_ACCEPT4);
}

int getpeername(int fd, struct sockaddr *addr, socklen_t *lenp) {
	if (likely(!fd_ok(fd) || !(LOAD(&g_flags[fd]) & (MPI5K_F_RELAYED | MPI5K_F_TRUEPEER))))
		return REAL(getpeername)(fd, addr, lenp);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	int r = REAL(getpeername)(fd, (struct sockaddr *)&ss, &sl);
	if (r != 0) return r; // not connected (any more): the kernel's answer stands
	int e = errno;
	struct mpi5k_ep seen;
	// The stored endpoint is only valid while the kernel still sees the
	// gateway: an fd closed behind our back (fclose, a raw syscall) and reused
	// must get the kernel's answer.
	if (mpi5k_sockaddr_to_ep((struct sockaddr *)&ss, sl, &seen) && is_gateway(&seen)) {
		struct mpi5k_ep p = g_peer[fd];
		sl = mpi5k_ep_to_sockaddr(&p, ss.ss_family, &ss);
	} else {
		fd_clear(fd);
	}
	copy_out(addr, lenp, &ss, sl);
	errno = e;
	return 0;
}

// ---- fd lifecycle -----------------------------------------------------------

// socket clears the new fd's entry: the number may have been closed behind
// the shim's back (fclose, a raw syscall) while it was managed.
int socket(int domain, int type, int proto) {
	int fd = REAL(socket)(domain, type, proto);
	if (fd >= 0) fd_clear(fd);
	return fd;
}

int close(int fd) {
	if (likely(!fd_ok(fd))) return REAL(close)(fd);
	uint8_t f = LOADR(&g_flags[fd]);
	if (f && LOADR(&g_tracing) && (f & MPI5K_F_TCP)) {
		mpi5k_sample_hook(fd, 0);
		fd_clear(fd);
		uint64_t t0 = mpi5k_now_ns();
		int r = REAL(close)(fd);
		int e = errno;
		trace_call(fd, FN_CLOSE, t0, r, 0, e);
		errno = e;
		return r;
	}
	if (f) STORE(&g_flags[fd], 0);
	return REAL(close)(fd);
}

int dup(int fd) {
	int r = REAL(dup)(fd);
	if (r >= 0 && fd_ok(fd)) fd_copy(fd, r);
	return r;
}

int dup2(int oldfd, int newfd) {
	int r = REAL(dup2)(oldfd, newfd);
	if (r >= 0 && oldfd != newfd && g_flags) fd_copy(oldfd, newfd);
	return r;
}

int dup3(int oldfd, int newfd, int flags) {
	int r = REAL(dup3)(oldfd, newfd, flags);
	if (r >= 0 && g_flags) fd_copy(oldfd, newfd);
	return r;
}

static int do_fcntl(fcntl_fn fn, int fd, int cmd, void *arg) {
	int r = fn(fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && g_flags) fd_copy(fd, r);
	return r;
}

// fcntl is variadic; every command takes at most one argument that fits in a
// pointer-sized register, so forwarding it as void * is exact on Linux ABIs.
int fcntl(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(REAL(fcntl), fd, cmd, arg);
}

// Programs built with _FILE_OFFSET_BITS=64 on glibc >= 2.28 call fcntl64.
int fcntl64(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(REAL(fcntl64), fd, cmd, arg);
}

static void clear_range(unsigned first, unsigned last) {
	if (!g_flags) return;
	unsigned hi = (unsigned)LOADR(&g_fd_hi);
	if (last > hi) last = hi;
	for (unsigned fd = first; fd <= last && fd < FD_MAX; fd++) fd_clear((int)fd);
}

int close_range(unsigned first, unsigned last, int flags) {
	if (!real_close_range) resolve();
	if (!real_close_range) {
		errno = ENOSYS;
		return -1;
	}
	int r = real_close_range(first, last, flags);
#ifdef CLOSE_RANGE_CLOEXEC
	if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC)) clear_range(first, last);
#else
	if (r == 0 && !(flags & (1U << 2))) clear_range(first, last);
#endif
	return r;
}

void closefrom(int lowfd) {
	if (!real_closefrom) resolve();
	if (lowfd >= 0) clear_range((unsigned)lowfd, ~0u);
	if (real_closefrom) real_closefrom(lowfd);
}

// ---- data calls: traced only -------------------------------------------------

#define TRACED(fd, fn, req, call)                                                                  \
	do {                                                                                       \
		if (likely(!LOADR(&g_tracing)) || !traced(fd)) return call;                        \
		uint64_t t0 = mpi5k_now_ns();                                                            \
		ssize_t r = call;                                                                  \
		int e = errno;                                                                     \
		trace_call(fd, fn, t0, r, req, e);                                                 \
		errno = e;                                                                         \
		return r;                                                                          \
	} while (0)

static size_t iov_len(const struct iovec *iov, int n) {
	size_t s = 0;
	for (int i = 0; iov && i < n; i++) s += iov[i].iov_len;
	return s;
}

ssize_t read(int fd, void *b, size_t n) { TRACED(fd, FN_READ, n, REAL(read)(fd, b, n)); }
ssize_t write(int fd, const void *b, size_t n) { TRACED(fd, FN_WRITE, n, REAL(write)(fd, b, n)); }
ssize_t readv(int fd, const struct iovec *v, int c) { TRACED(fd, FN_READV, iov_len(v, c), REAL(readv)(fd, v, c)); }
ssize_t writev(int fd, const struct iovec *v, int c) {
	TRACED(fd, FN_WRITEV, iov_len(v, c), REAL(writev)(fd, v, c));
}
ssize_t send(int fd, const void *b, size_t n, int fl) { TRACED(fd, FN_SEND, n, REAL(send)(fd, b, n, fl)); }
ssize_t sendto(int fd, const void *b, size_t n, int fl, const struct sockaddr *a, socklen_t al) {
	TRACED(fd, FN_SENDTO, n, REAL(sendto)(fd, b, n, fl, a, al));
}
ssize_t sendmsg(int fd, const struct msghdr *m, int fl) {
	TRACED(fd, FN_SENDMSG, m ? iov_len(m->msg_iov, (int)m->msg_iovlen) : 0, REAL(sendmsg)(fd, m, fl));
}
ssize_t recv(int fd, void *b, size_t n, int fl) { TRACED(fd, FN_RECV, n, REAL(recv)(fd, b, n, fl)); }
ssize_t recvfrom(int fd, void *b, size_t n, int fl, struct sockaddr *a, socklen_t *al) {
	TRACED(fd, FN_RECVFROM, n, REAL(recvfrom)(fd, b, n, fl, a, al));
}
ssize_t recvmsg(int fd, struct msghdr *m, int fl) {
	TRACED(fd, FN_RECVMSG, m ? iov_len(m->msg_iov, (int)m->msg_iovlen) : 0, REAL(recvmsg)(fd, m, fl));
}

// _FORTIFY_SOURCE builds (Debian's default for packages) call these instead.
ssize_t __read_chk(int fd, void *b, size_t n, size_t bl) {
	TRACED(fd, FN_READ, n, REAL(__read_chk)(fd, b, n, bl));
}
ssize_t __recv_chk(int fd, void *b, size_t n, size_t bl, int fl) {
	TRACED(fd, FN_RECV, n, REAL(__recv_chk)(fd, b, n, bl, fl));
}
ssize_t __recvfrom_chk(int fd, void *b, size_t n, size_t bl, int fl, struct sockaddr *a, socklen_t *al) {
	TRACED(fd, FN_RECVFROM, n, REAL(__recvfrom_chk)(fd, b, n, bl, fl, a, al));
}
