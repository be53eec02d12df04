// Shared declarations between the C interception layer (intercept.c) and the
// Go side of the shim. Only declarations here: cgo copies the preamble of a
// file with //export into two C files, so definitions live in .c files.
#ifndef MPI5K_SHIM_H
#define MPI5K_SHIM_H

#include <stdint.h>
#include <sys/socket.h>

// An endpoint as the fd table stores it: family 4 or 6 (0 = none), port in
// host order, address bytes (IPv4 in the first 4), IPv6 scope id.
struct mpi5k_ep {
	uint8_t family;
	uint8_t site; // site id when known, else 0
	uint16_t port;
	uint8_t addr[16];
	uint32_t scope;
};

// Trace record, 64 bytes, little-endian, mirrored by trace/format.go.
// kind 1 (call):  fields as named.
// kind 2 (conn):  the same 24-byte head, then the local and true peer
//                 endpoints (struct mpi5k_conn_rec).
// kind 3 (lost):  ret = number of records dropped because the ring was full.
#define MPI5K_REC_CALL 1
#define MPI5K_REC_CONN 2
#define MPI5K_REC_LOST 3
struct mpi5k_rec {
	uint64_t t;     // CLOCK_MONOTONIC ns at the start of the call
	uint32_t dur;   // ns the call took (saturated)
	uint32_t tid;   // kernel thread id
	int32_t fd;
	uint8_t kind;
	uint8_t fn;
	uint16_t flags;
	int64_t ret;    // return value
	uint64_t req;   // bytes requested
	int32_t err;    // errno when ret < 0
	uint32_t resv0;
	uint8_t resv1[16];
};

struct mpi5k_trace_ep {
	uint8_t family; // 4, 6 or 0
	uint8_t site;
	uint16_t port;
	uint8_t addr[16];
};

// A kind-2 record: the head of struct mpi5k_rec, then two endpoints where
// ret..resv1 sit in a call record.
struct mpi5k_conn_rec {
	uint64_t t;
	uint32_t dur;
	uint32_t tid;
	int32_t fd;
	uint8_t kind;
	uint8_t fn;
	uint16_t flags;
	struct mpi5k_trace_ep local; // offset 24
	struct mpi5k_trace_ep peer;  // offset 44
};

_Static_assert(sizeof(struct mpi5k_rec) == 64, "trace record is 64 bytes (trace/format.go)");
_Static_assert(sizeof(struct mpi5k_conn_rec) == 64, "conn record is 64 bytes (trace/format.go)");
_Static_assert(__builtin_offsetof(struct mpi5k_conn_rec, local) == 24, "local endpoint at 24");
_Static_assert(__builtin_offsetof(struct mpi5k_conn_rec, peer) == 44, "peer endpoint at 44");

// Results of mpi5kGoConnect.
#define MPI5K_PASS 1          // not for us: call the real connect
#define MPI5K_RELAYED 0       // connected to the gateway, OPEN sent; blocking socket
#define MPI5K_RELAYED_NB 2    // same, the socket was non-blocking: report EINPROGRESS

// fd table flags.
#define MPI5K_F_RELAYED 0x01  // connect() went through the gateway; peer = stored endpoint
#define MPI5K_F_TRUEPEER 0x02 // accepted from the gateway; peer = stored true source
#define MPI5K_F_KNOWN 0x04    // socket type classified for tracing
#define MPI5K_F_TCP 0x08      // ... and it is a TCP socket

// C side, called from Go.
int mpi5k_enabled(void);
int mpi5k_trace_wanted(void);
void mpi5k_set_gateways(const struct mpi5k_ep *eps, int n);
void mpi5k_set_trace_fd(int fd);
int mpi5k_trace_flush(void);
void mpi5k_trace_stats(uint64_t *written, uint64_t *lost);
int mpi5k_allow_loopback(void);
int mpi5k_fd_flags(int fd);
void mpi5k_sleep_ms(int ms);
int mpi5k_sockaddr_to_ep(const struct sockaddr *sa, socklen_t len, struct mpi5k_ep *ep);

#endif
