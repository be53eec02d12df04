// shimtest: C test programs for libmpi5k.so, driven by shim/test/shim_test.go.
// Each mode prints one result line and exits 0 only when everything checked
// out, so the Go test can assert on both.
//
//   conn SRC DST PORT                one connection: bind SRC, connect, echo, getpeername
//   fdlist SRC DST PORT              one connection, then list the open fds below 900
//   refused SRC DST PORT             a dead destination port: reset or EOF, no hang
//   conn6 SRC DST PORT               the same on an AF_INET6 socket, v4-mapped
//   fork N SRC DST PORT              fork N children (no exec) while another thread is in Go
//   forkexec SRC DST PORT SELF       fork + exec SELF conn ...
//   threads N ITER SRC DST PORT      N threads each connect/echo/close ITER times
//   dup SRC DST PORT                 dup/dup2/dup3/F_DUPFD over managed fds
//   errno SRC DST PORT DEADPORT      errno preserved / set right
//   serve IP PORT N PREFIX           echo server: N connections, peers must start with PREFIX
//   stress N SRC DST PORT SEED MAX   N concurrent connections, random sizes <= MAX, checksums
//   bench-write N [1]                ns per write() on /dev/null [with an idle thread]
//   bench-traced N                   ns per failing send() on a TCP socket
//   sigurg                           SIGURGs a host handler receives in 0.5 s
//   nop | status                     start-up cost; threads, RSS and fds
//   bench-connect N SRC DST PORT     us per connect+close
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_src, *g_dst;
static int g_port;

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));                       \
		return -1;                                                                         \
	} while (0)

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// Addresses are IPv4 unless the text has a ':' (native IPv6 sites).
static int family_of(const char *ip) { return strchr(ip, ':') ? AF_INET6 : AF_INET; }

// mkaddr fills ss with ip:port and returns its length.
static socklen_t mkaddr(struct sockaddr_storage *ss, const char *ip, int port) {
	memset(ss, 0, sizeof *ss);
	if (family_of(ip) == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		inet_pton(AF_INET6, ip, &s6->sin6_addr);
		return sizeof *s6;
	}
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	s4->sin_family = AF_INET;
	s4->sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, ip, &s4->sin_addr);
	return sizeof *s4;
}

// ntop writes ss's address into buf and returns its port.
static int ntop(const struct sockaddr_storage *ss, char *buf, size_t n) {
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &s6->sin6_addr, buf, (socklen_t)n);
		return ntohs(s6->sin6_port);
	}
	const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
	inet_ntop(AF_INET, &s4->sin_addr, buf, (socklen_t)n);
	return ntohs(s4->sin_port);
}

// dial binds src (port 0, like Open MPI) and connects to dst:port.
static int dial(const char *src, const char *dst, int port, int nonblock) {
	int fd = socket(family_of(dst), SOCK_STREAM, 0);
	if (fd < 0) return -1;
	struct sockaddr_storage sa;
	socklen_t sl;
	if (src && *src) {
		sl = mkaddr(&sa, src, 0);
		if (bind(fd, (struct sockaddr *)&sa, sl) != 0) {
			close(fd);
			return -1;
		}
	}
	if (nonblock) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	sl = mkaddr(&sa, dst, port);
	if (connect(fd, (struct sockaddr *)&sa, sl) != 0) {
		if (!nonblock || errno != EINPROGRESS) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		struct pollfd p = {fd, POLLOUT, 0};
		if (poll(&p, 1, 10000) != 1) {
			close(fd);
			errno = ETIMEDOUT;
			return -1;
		}
		int err = 0;
		socklen_t l = sizeof err;
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
		if (err) {
			close(fd);
			errno = err;
			return -1;
		}
	}
	return fd;
}

static int write_all(int fd, const void *p, size_t n) {
	const char *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0) {
			if (errno == EINTR) continue;
			return -1;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n) {
	char *b = p;
	while (n) {
		ssize_t r = read(fd, b, n);
		if (r < 0 && errno == EINTR) continue;
		if (r <= 0) return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int check_peer(int fd, const char *ip, int port) {
	struct sockaddr_storage sa;
	socklen_t l = sizeof sa;
	if (getpeername(fd, (struct sockaddr *)&sa, &l) != 0) FAIL("getpeername");
	char buf[64];
	int got = ntop(&sa, buf, sizeof buf);
	if (strcmp(buf, ip) != 0 || got != port) {
		errno = 0;
		FAIL("getpeername says %s:%d, want %s:%d", buf, got, ip, port);
	}
	return 0;
}

// one_conn: connect, echo a few bytes, check the peer address, close.
static int one_conn(int nonblock) {
	int fd = dial(g_src, g_dst, g_port, nonblock);
	if (fd < 0) FAIL("dial %s -> %s:%d", g_src, g_dst, g_port);
	if (nonblock) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	char out[100], in[100];
	for (int i = 0; i < 100; i++) out[i] = (char)(i * 7 + fd);
	if (write_all(fd, out, sizeof out) || read_all(fd, in, sizeof in)) {
		close(fd);
		FAIL("echo");
	}
	if (memcmp(out, in, sizeof out)) {
		close(fd);
		errno = 0;
		FAIL("echo mismatch");
	}
	if (check_peer(fd, g_dst, g_port)) {
		close(fd);
		return -1;
	}
	return close(fd);
}

// conn6: the same over an AF_INET6 socket with v4-mapped addresses: the
// gateway (IPv4 in the map) is reached v4-mapped and getpeername answers a
// sockaddr_in6.
static int conn6(void) {
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 sa;
	char buf[64];
	memset(&sa, 0, sizeof sa);
	sa.sin6_family = AF_INET6;
	snprintf(buf, sizeof buf, "::ffff:%s", g_src);
	inet_pton(AF_INET6, buf, &sa.sin6_addr);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) FAIL("bind6");
	snprintf(buf, sizeof buf, "::ffff:%s", g_dst);
	inet_pton(AF_INET6, buf, &sa.sin6_addr);
	sa.sin6_port = htons((uint16_t)g_port);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) FAIL("connect6");
	char out[10] = "012345678", in[10] = {0};
	if (write_all(fd, out, 10) || read_all(fd, in, 10) || memcmp(in, out, 10)) FAIL("echo6");
	struct sockaddr_in6 pa;
	socklen_t l = sizeof pa;
	if (getpeername(fd, (struct sockaddr *)&pa, &l) != 0 || l != sizeof pa || pa.sin6_family != AF_INET6) FAIL("getpeername6");
	char got[64];
	inet_ntop(AF_INET6, &pa.sin6_addr, got, sizeof got);
	if (strcmp(got, buf) || ntohs(pa.sin6_port) != g_port) {
		errno = 0;
		FAIL("getpeername6 says [%s]:%d, want [%s]:%d", got, ntohs(pa.sin6_port), buf, g_port);
	}
	close(fd);
	printf("conn6 ok\n");
	return 0;
}

// mode_refused: a destination port nobody listens on, behind the gateways:
// connect() may succeed (it only reaches the local gateway) but the failure
// must come back as a reset or EOF, never a hang.
static int mode_refused(void) {
	uint64_t t0 = now_ns();
	int fd = dial(g_src, g_dst, g_port, 0);
	if (fd < 0) {
		printf("refused ok at connect errno=%d (%s) ms=%.1f\n", errno, strerror(errno), (now_ns() - t0) / 1e6);
		return 0;
	}
	send(fd, "x", 1, MSG_NOSIGNAL);
	struct pollfd p = {fd, POLLIN, 0};
	if (poll(&p, 1, 10000) != 1) FAIL("no reset or EOF within 10 s");
	char c;
	ssize_t n = read(fd, &c, 1);
	if (n > 0) FAIL("read data from a refused destination");
	printf("refused ok at read n=%zd errno=%d (%s) ms=%.1f\n", n, n < 0 ? errno : 0, n < 0 ? strerror(errno) : "EOF",
	       (now_ns() - t0) / 1e6);
	close(fd);
	return 0;
}

// ---- signals ----

static volatile int g_urg;
static void on_urg(int sig) {
	(void)sig;
	g_urg++;
}

// mode_sigurg: a host with its own SIGURG handler (orterun has one) counts
// the SIGURGs it receives while the shim's Go runtime starts and works.
static int mode_sigurg(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_urg;
	sigaction(SIGURG, &sa, NULL);
	for (int i = 0; i < 50; i++) usleep(10000);
	printf("sigurg=%d\n", g_urg);
	return 0;
}

// ---- fork ----

static volatile int g_stop;

static void *go_churn(void *arg) {
	(void)arg;
	while (!g_stop) one_conn(0); // each relayed connect enters Go
	return NULL;
}

static int mode_fork(int n) {
	pthread_t th[2];
	for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, go_churn, NULL);
	int ok = 0;
	for (int i = 0; i < n; i++) {
		pid_t p = fork();
		if (p == 0) {
			alarm(10); // a hang shows up as SIGALRM, not a stuck test
			int r = one_conn(i & 1);
			int fd = dup(1);
			dup2(fd, 60);
			close(fd);
			close(60);
			_exit(r == 0 ? 0 : 1);
		}
		int st;
		if (p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
		else fprintf(stderr, "child %d: status %x\n", i, st);
	}
	g_stop = 1;
	for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
	printf("fork ok=%d/%d\n", ok, n);
	return ok == n ? 0 : 1;
}

static int mode_forkexec(const char *self) {
	pid_t p = fork();
	if (p == 0) {
		char port[16];
		snprintf(port, sizeof port, "%d", g_port);
		execl(self, self, "conn", g_src, g_dst, port, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	waitpid(p, &st, 0);
	int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	printf("forkexec ok=%d\n", ok);
	return ok ? 0 : 1;
}

// ---- threads ----

static int g_iter;
static int g_thread_fail;

static void *thread_main(void *arg) {
	long id = (long)arg;
	for (int i = 0; i < g_iter; i++)
		if (one_conn((int)((id + i) & 1)) != 0) __atomic_fetch_add(&g_thread_fail, 1, __ATOMIC_RELAXED);
	return NULL;
}

static int mode_threads(int n) {
	pthread_t *th = calloc((size_t)n, sizeof *th);
	for (long i = 0; i < n; i++) pthread_create(&th[i], NULL, thread_main, (void *)i);
	for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
	printf("threads n=%d iter=%d failed=%d\n", n, g_iter, g_thread_fail);
	return g_thread_fail ? 1 : 0;
}

// ---- dup family ----

static int mode_dup(void) {
	int a = dial(g_src, g_dst, g_port, 0);
	if (a < 0) FAIL("dial");
	int b = socket(family_of(g_dst), SOCK_STREAM, 0); // a plain, unconnected socket
	struct sockaddr_storage sa;
	int d = dup(a);
	if (check_peer(d, g_dst, g_port)) return -1;
	int e = fcntl(a, F_DUPFD_CLOEXEC, 200);
	if (e < 200 || check_peer(e, g_dst, g_port)) FAIL("F_DUPFD_CLOEXEC");
	if (dup2(a, b) != b || check_peer(b, g_dst, g_port)) FAIL("dup2 over a plain socket");
	close(a);
	if (check_peer(b, g_dst, g_port)) FAIL("dup2 copy after closing the original");
	int c = dial(g_src, g_dst, g_port, 0);
	if (dup3(c, d, O_CLOEXEC) != d || check_peer(d, g_dst, g_port)) FAIL("dup3");
	// dup2 of an unconnected socket over the managed fd: the kernel's answer
	// (ENOTCONN) must come back, not the stored endpoint.
	int u = socket(family_of(g_dst), SOCK_STREAM, 0);
	if (dup2(u, b) != b) FAIL("dup2 unconnected");
	socklen_t l = sizeof sa;
	errno = 0;
	if (getpeername(b, (struct sockaddr *)&sa, &l) == 0 || errno != ENOTCONN) FAIL("getpeername after dup2 over a managed fd");
	// the echo still works through the duplicates
	char x = 'q', y = 0;
	if (write_all(e, &x, 1) || read_all(e, &y, 1) || y != 'q') FAIL("echo through F_DUPFD copy");
	close(b);
	close(c);
	close(d);
	close(e);
	close(u);
	printf("dup ok\n");
	return 0;
}

// ---- errno ----

static int mode_errno(int deadport) {
	int fd = dial(g_src, g_dst, g_port, 0);
	if (fd < 0) FAIL("dial");
	int nul = open("/dev/null", O_WRONLY);
	errno = 4242;
	if (write(nul, "x", 1) != 1 || errno != 4242) FAIL("write /dev/null changed errno");
	struct sockaddr_storage sa;
	socklen_t l = sizeof sa;
	errno = 4242;
	if (getpeername(fd, (struct sockaddr *)&sa, &l) != 0 || errno != 4242) FAIL("getpeername changed errno");
	errno = 4242;
	if (write(fd, "ab", 2) != 2 || errno != 4242) FAIL("write changed errno");
	char b[2];
	errno = 4242;
	if (read_all(fd, b, 2) || errno != 4242) FAIL("read changed errno");
	errno = 4242;
	int d = dup(fd);
	if (d < 0 || errno != 4242) FAIL("dup changed errno");
	errno = 4242;
	if (close(d) != 0 || errno != 4242) FAIL("close changed errno");
	errno = 4242;
	if (close(fd) != 0 || errno != 4242) FAIL("close of relayed fd changed errno");
	// A relayed connect itself, blocking, must leave errno alone on success.
	int s = socket(family_of(g_dst), SOCK_STREAM, 0);
	socklen_t sl = mkaddr(&sa, g_src, 0);
	bind(s, (struct sockaddr *)&sa, sl);
	sl = mkaddr(&sa, g_dst, g_port);
	errno = 4242;
	if (connect(s, (struct sockaddr *)&sa, sl) != 0 || errno != 4242) FAIL("connect changed errno");
	close(s);
	// Failures carry the right errno.
	errno = 0;
	if (read(-1, b, 1) != -1 || errno != EBADF) FAIL("read(-1) errno");
	errno = 0;
	if (close(-1) != -1 || errno != EBADF) FAIL("close(-1) errno");
	errno = 0;
	if (getpeername(nul, (struct sockaddr *)&sa, &l) != -1 || errno != ENOTSOCK) FAIL("getpeername on a file");
	// An unreachable destination port behind the gateway: the gateway resets
	// the connection, so the failure shows on the first read (ECONNRESET or EOF).
	int r = dial(g_src, g_dst, deadport, 0);
	if (r >= 0) {
		write(r, "x", 1);
		char c;
		ssize_t n = read(r, &c, 1);
		if (n > 0) FAIL("read from a refused destination returned data");
		close(r);
	}
	close(nul);
	printf("errno ok\n");
	return 0;
}

// ---- echo server (accept side) ----

static const char *g_prefix;
static int g_serve_fail;

static void *serve_conn(void *arg) {
	int fd = (int)(long)arg;
	char buf[65536];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n < 0 && errno == EINTR) continue;
		if (n <= 0) break;
		if (write_all(fd, buf, (size_t)n)) break;
	}
	shutdown(fd, SHUT_WR);
	close(fd);
	return NULL;
}

static int mode_serve(const char *ip, int port, int n) {
	int ls = socket(family_of(ip), SOCK_STREAM, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_storage sa;
	socklen_t sl = mkaddr(&sa, ip, port);
	if (bind(ls, (struct sockaddr *)&sa, sl) || listen(ls, 4096)) FAIL("listen %s:%d", ip, port);
	printf("listening\n");
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		struct sockaddr_storage pa, pb;
		socklen_t la = sizeof pa, lb = sizeof pb;
		int fd = (i & 1) ? accept4(ls, (struct sockaddr *)&pa, &la, SOCK_CLOEXEC) : accept(ls, (struct sockaddr *)&pa, &la);
		if (fd < 0) FAIL("accept");
		char a[64], b[64];
		int porta = ntop(&pa, a, sizeof a);
		if (getpeername(fd, (struct sockaddr *)&pb, &lb) != 0) FAIL("getpeername");
		int portb = ntop(&pb, b, sizeof b);
		if (strncmp(a, g_prefix, strlen(g_prefix)) || strcmp(a, b) || porta != portb) {
			fprintf(stderr, "peer: accept says %s:%d, getpeername %s:%d, want prefix %s\n", a,
			        porta, b, portb, g_prefix);
			g_serve_fail++;
		}
		pthread_t th;
		pthread_create(&th, NULL, serve_conn, (void *)(long)fd);
		pthread_detach(th);
	}
	sleep(1);
	printf("serve n=%d badpeer=%d\n", n, g_serve_fail);
	return g_serve_fail ? 1 : 0;
}

// ---- stress ----

struct sconn {
	int id, nonblock;
	size_t size;
	uint64_t seed;
	int ok;
	size_t got;
};

static uint64_t xs(uint64_t *s) {
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void fill(uint64_t seed, unsigned char *p, size_t n) {
	uint64_t s = seed | 1;
	for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(xs(&s) >> 24);
}

struct writer_arg {
	int fd;
	unsigned char *p;
	size_t n;
	int err;
};

static void *writer(void *a) {
	struct writer_arg *w = a;
	size_t off = 0;
	uint64_t s = (uint64_t)w->n | 1;
	while (off < w->n) {
		size_t chunk = 1 + xs(&s) % 70000; // random write sizes
		if (chunk > w->n - off) chunk = w->n - off;
		if (write_all(w->fd, w->p + off, chunk)) {
			w->err = errno;
			return NULL;
		}
		off += chunk;
	}
	shutdown(w->fd, SHUT_WR); // half-close: the echo continues the other way
	return NULL;
}

static void *stress_conn(void *arg) {
	struct sconn *c = arg;
	unsigned char *out = malloc(c->size + 1), *in = malloc(c->size + 1);
	fill(c->seed, out, c->size);
	int fd = dial(g_src, g_dst, g_port, c->nonblock);
	if (fd < 0) {
		fprintf(stderr, "conn %d: dial: %s\n", c->id, strerror(errno));
		goto out;
	}
	if (!c->nonblock) {
		struct writer_arg w = {fd, out, c->size, 0};
		pthread_t th;
		pthread_create(&th, NULL, writer, &w);
		size_t got = 0;
		for (;;) {
			ssize_t n = read(fd, in + got, c->size + 1 - got);
			if (n < 0 && errno == EINTR) continue;
			if (n <= 0) break;
			got += (size_t)n;
		}
		pthread_join(th, NULL);
		c->got = got;
		c->ok = w.err == 0 && got == c->size && memcmp(in, out, c->size) == 0;
	} else {
		size_t sent = 0, got = 0;
		int wdone = 0;
		uint64_t s = c->seed;
		for (;;) {
			struct pollfd p = {fd, (short)(POLLIN | (wdone ? 0 : POLLOUT)), 0};
			if (poll(&p, 1, 20000) <= 0) break;
			if (!wdone && (p.revents & POLLOUT)) {
				size_t chunk = 1 + xs(&s) % 70000;
				if (chunk > c->size - sent) chunk = c->size - sent;
				ssize_t n = chunk ? send(fd, out + sent, chunk, MSG_NOSIGNAL) : 0;
				if (n > 0) sent += (size_t)n;
				else if (n < 0 && errno != EAGAIN && errno != EINTR) break;
				if (sent == c->size) {
					shutdown(fd, SHUT_WR);
					wdone = 1;
				}
			}
			if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
				ssize_t n = recv(fd, in + got, c->size + 1 - got, 0);
				if (n == 0) break;
				if (n < 0 && errno != EAGAIN && errno != EINTR) break;
				if (n > 0) got += (size_t)n;
			}
		}
		c->got = got;
		c->ok = wdone && got == c->size && memcmp(in, out, c->size) == 0;
	}
	if (!c->ok) fprintf(stderr, "conn %d (%s): size %zu got %zu\n", c->id, c->nonblock ? "nb" : "blk", c->size, c->got);
	close(fd);
out:
	free(out);
	free(in);
	return NULL;
}

static int mode_stress(int n, uint64_t seed, size_t max) {
	struct sconn *cs = calloc((size_t)n, sizeof *cs);
	pthread_t *th = calloc((size_t)n, sizeof *th);
	uint64_t s = seed | 1;
	size_t total = 0;
	uint64_t t0 = now_ns();
	for (int i = 0; i < n; i++) {
		cs[i].id = i;
		cs[i].nonblock = i & 1;
		cs[i].seed = xs(&s);
		// mostly small messages, some large, some empty
		uint64_t r = xs(&s);
		cs[i].size = (r % 10 == 0) ? 0 : (r % 3 == 0) ? (size_t)(xs(&s) % max) : (size_t)(xs(&s) % 4096);
		total += cs[i].size;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setstacksize(&at, 256 << 10);
		if (pthread_create(&th[i], &at, stress_conn, &cs[i]) != 0) FAIL("pthread_create");
	}
	int ok = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		ok += cs[i].ok;
	}
	printf("stress ok=%d/%d bytes=%zu secs=%.2f\n", ok, n, total, (double)(now_ns() - t0) / 1e9);
	return ok == n ? 0 : 1;
}

// ---- benchmarks ----

static void *idle_thread(void *a) {
	(void)a;
	for (;;) pause();
	return NULL;
}

// mode_bench_write: with idle=1 an idle thread exists first. The kernel takes
// a lighter path for fd syscalls in single-threaded processes (no struct file
// refcount), so any library that starts a thread -- the Go runtime does --
// adds ~35 ns per fd syscall here; MPI processes are multi-threaded anyway,
// so the shim's own cost is preloaded vs bare-with-a-thread.
static int mode_bench_write(long n, int idle) {
	if (idle) {
		pthread_t th;
		pthread_create(&th, NULL, idle_thread, NULL);
	}
	int fd = open("/dev/null", O_WRONLY);
	char c = 0;
	for (long i = 0; i < n / 10; i++) write(fd, &c, 1); // warm up
	// Thread CPU time, not wall time: on a shared machine preemption by other
	// processes inflates wall time but not the time this thread ran.
	struct timespec a, b;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
	for (long i = 0; i < n; i++) write(fd, &c, 1);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
	double t = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
	printf("write ns/op=%.1f\n", t / (double)n);
	return 0;
}

// mode_bench_traced: send() on an unconnected TCP socket fails at once
// (EPIPE) but is a traced call on a TCP socket: run with and without
// MPI5K_TRACE, the difference is the cost of recording.
static int mode_bench_traced(long n) {
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char c = 0;
	for (long i = 0; i < 1000; i++) send(fd, &c, 1, MSG_NOSIGNAL);
	struct timespec a, b;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
	for (long i = 0; i < n; i++) send(fd, &c, 1, MSG_NOSIGNAL);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
	double t = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
	printf("send ns/op=%.1f\n", t / (double)n);
	return 0;
}

static int mode_bench_connect(int n) {
	uint64_t best = ~0ull, sum = 0;
	for (int i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		int fd = dial(g_src, g_dst, g_port, 0);
		uint64_t t = now_ns() - t0;
		if (fd < 0) FAIL("dial");
		char x = 1;
		write_all(fd, &x, 1);
		read_all(fd, &x, 1);
		close(fd);
		sum += t;
		if (t < best) best = t;
	}
	printf("connect us/op mean=%.1f min=%.1f\n", (double)sum / n / 1e3, (double)best / 1e3);
	return 0;
}

// ---- liveness options of relayed connections ----

static void print_liveness(int fd, const char *side) {
	int ka = -1, idle = -1, intvl = -1, cnt = -1, ut = -1;
	socklen_t l = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &ka, &l);
	getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &l);
	getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, &l);
	getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, &l);
	getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, &l);
	printf("%s keepalive=%d idle=%d intvl=%d cnt=%d user_timeout=%d\n", side, ka, idle, intvl, cnt, ut);
}

// mode_liveness connects (setting its own keepalive first when own) and
// prints the connected socket's liveness options.
static int mode_liveness(int own) {
	int fd = socket(family_of(g_dst), SOCK_STREAM, 0);
	struct sockaddr_storage sa;
	socklen_t sl = mkaddr(&sa, g_src, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sl) != 0) FAIL("bind");
	if (own) {
		int one = 1, idle = 77;
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	}
	sl = mkaddr(&sa, g_dst, g_port);
	if (connect(fd, (struct sockaddr *)&sa, sl) != 0) FAIL("connect");
	print_liveness(fd, "connect");
	return close(fd);
}

// mode_liveness_accept accepts one connection on ip:port and prints its
// liveness options.
static int mode_liveness_accept(const char *ip, int port) {
	int ls = socket(family_of(ip), SOCK_STREAM, 0);
	struct sockaddr_storage sa;
	socklen_t sl = mkaddr(&sa, ip, port);
	if (bind(ls, (struct sockaddr *)&sa, sl) || listen(ls, 4)) FAIL("listen %s:%d", ip, port);
	printf("listening\n");
	fflush(stdout);
	int fd = accept(ls, NULL, NULL);
	if (fd < 0) FAIL("accept");
	print_liveness(fd, "accept");
	return close(fd);
}

int main(int argc, char **argv) {
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) return 2;
	const char *m = argv[1];
#define ARGS(k)                                                                                    \
	if (argc < (k)) {                                                                          \
		fprintf(stderr, "%s: missing arguments\n", m);                                    \
		return 2;                                                                          \
	}
	if (!strcmp(m, "nop")) return 0;
	if (!strcmp(m, "sigurg")) return mode_sigurg();
	if (!strcmp(m, "status")) { // threads, RSS and open fds of this process
		FILE *f = fopen("/proc/self/status", "r");
		char line[256];
		while (f && fgets(line, sizeof line, f))
			if (!strncmp(line, "Threads:", 8) || !strncmp(line, "VmRSS:", 6)) fputs(line, stdout);
		if (f) fclose(f);
		int n = 0;
		for (int fd = 0; fd < 1024; fd++) n += fcntl(fd, F_GETFD) >= 0;
		printf("Fds: %d\n", n);
		return 0;
	}
	if (!strcmp(m, "bench-write")) {
		ARGS(3);
		return mode_bench_write(atol(argv[2]), argc > 3 && atoi(argv[3]) == 1);
	}
	if (!strcmp(m, "bench-traced")) {
		ARGS(3);
		return mode_bench_traced(atol(argv[2]));
	}
	if (!strcmp(m, "liveness-accept")) {
		ARGS(4);
		return mode_liveness_accept(argv[2], atoi(argv[3])) ? 1 : 0;
	}
	if (!strcmp(m, "serve")) {
		ARGS(6);
		g_prefix = argv[5];
		return mode_serve(argv[2], atoi(argv[3]), atoi(argv[4])) ? 1 : 0;
	}
	int k = 2;
	int num = 0;
	if (!strcmp(m, "fork") || !strcmp(m, "threads") || !strcmp(m, "stress") || !strcmp(m, "bench-connect")) {
		ARGS(3);
		num = atoi(argv[k++]);
	}
	if (!strcmp(m, "threads")) {
		ARGS(4);
		g_iter = atoi(argv[k++]);
	}
	ARGS(k + 3);
	g_src = argv[k];
	g_dst = argv[k + 1];
	g_port = atoi(argv[k + 2]);
	k += 3;
	if (!strcmp(m, "conn")) return one_conn(0) ? 1 : 0;
	if (!strcmp(m, "liveness")) return mode_liveness(argc > 5 && !strcmp(argv[5], "own")) ? 1 : 0;
	if (!strcmp(m, "conn6")) return conn6() ? 1 : 0;
	if (!strcmp(m, "refused")) return mode_refused() ? 1 : 0;
	if (!strcmp(m, "fdlist")) { // after a connection and a while: open fds below 900
		if (one_conn(0)) return 1;
		usleep(100000);
		for (int fd = 0; fd < 900; fd++)
			if (fcntl(fd, F_GETFD) >= 0) printf("%d ", fd);
		printf("\n");
		return 0;
	}
	if (!strcmp(m, "fork")) return mode_fork(num);
	if (!strcmp(m, "threads")) return mode_threads(num);
	if (!strcmp(m, "dup")) return mode_dup() ? 1 : 0;
	if (!strcmp(m, "bench-connect")) return mode_bench_connect(num) ? 1 : 0;
	if (!strcmp(m, "forkexec")) {
		ARGS(k + 1);
		return mode_forkexec(argv[k]);
	}
	if (!strcmp(m, "errno")) {
		ARGS(k + 1);
		return mode_errno(atoi(argv[k])) ? 1 : 0;
	}
	if (!strcmp(m, "stress")) {
		ARGS(k + 2);
		return mode_stress(num, strtoull(argv[k], NULL, 10), (size_t)atol(argv[k + 1]));
	}
	fprintf(stderr, "unknown mode %s\n", m);
	return 2;
}
