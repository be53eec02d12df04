// Endpoints to and from sockaddrs, and which addresses are the host's own.
// Both intercept.c and record.c convert addresses; neither calls the other
// for it.
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "internal.h"

// An IPv4-mapped IPv6 address (RFC 4291 2.5.5.2) is this prefix, then the
// IPv4 address.
static const uint8_t v4mapped_prefix[12] = {[10] = 0xff, [11] = 0xff};
#define V4MAPPED_ADDR sizeof v4mapped_prefix // where the IPv4 address starts

// mpi5k_sockaddr_to_ep reads an IPv4 or IPv6 sockaddr into ep (an
// IPv4-mapped address as IPv4) and returns 1; 0 for any other.
int mpi5k_sockaddr_to_ep(const struct sockaddr *sa, socklen_t len, struct mpi5k_ep *ep) {
	memset(ep, 0, sizeof *ep);
	if (sa == NULL) return 0;
	if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		ep->family = 4;
		ep->port = ntohs(s->sin_port);
		memcpy(ep->addr, &s->sin_addr, 4);
		return 1;
	}
	if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		ep->port = ntohs(s->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) { // compare as IPv4
			ep->family = 4;
			memcpy(ep->addr, &s->sin6_addr.s6_addr[V4MAPPED_ADDR], 4);
		} else {
			ep->family = 6;
			memcpy(ep->addr, &s->sin6_addr, 16);
			ep->scope = s->sin6_scope_id;
		}
		return 1;
	}
	return 0;
}

// mpi5k_ep_to_sockaddr renders ep in the family of the socket (an IPv6
// socket gets an IPv4 peer as a v4-mapped address); returns the length.
socklen_t mpi5k_ep_to_sockaddr(const struct mpi5k_ep *ep, int family, struct sockaddr_storage *ss) {
	memset(ss, 0, sizeof *ss);
	if (family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(ep->port);
		if (ep->family == 4) {
			memcpy(s->sin6_addr.s6_addr, v4mapped_prefix, sizeof v4mapped_prefix);
			memcpy(&s->sin6_addr.s6_addr[V4MAPPED_ADDR], ep->addr, 4);
		} else {
			memcpy(&s->sin6_addr, ep->addr, 16);
			s->sin6_scope_id = ep->scope;
		}
		return sizeof *s;
	}
	struct sockaddr_in *s = (struct sockaddr_in *)ss;
	s->sin_family = AF_INET;
	s->sin_port = htons(ep->port);
	memcpy(&s->sin_addr, ep->addr, 4);
	return sizeof *s;
}

// mpi5k_is_local_addr tells whether sa is a loopback or unspecified address,
// in either family.
int mpi5k_is_local_addr(const struct sockaddr *sa) {
	if (sa->sa_family == AF_INET) {
		uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
		return (a >> 24) == 127 || a == 0;
	}
	const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
	if (IN6_IS_ADDR_LOOPBACK(a) || IN6_IS_ADDR_UNSPECIFIED(a)) return 1;
	return IN6_IS_ADDR_V4MAPPED(a) &&
	       (a->s6_addr[V4MAPPED_ADDR] == 127 || !memcmp(&a->s6_addr[V4MAPPED_ADDR], "\0\0\0\0", 4));
}
