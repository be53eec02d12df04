package main

// Go functions called from intercept.c. Declarations only in this preamble:
// cgo copies it into _cgo_export.h as well.

/*
#include "shim.h"
*/
import "C"

import (
	"net/netip"
	"unsafe"
)

// mpi5kGoInit loads the configuration once and reports whether this process
// relays (1) or only passes through (0).
//
//export mpi5kGoInit
func mpi5kGoInit() C.int {
	if c := getConfig(); c != nil {
		return 1
	}
	return 0
}

// mpi5kGoConnect relays a connect() of fd to sa when sa is in another site:
// it connects fd to the local gateway and sends OPEN. Returns MPI5K_PASS,
// MPI5K_RELAYED, MPI5K_RELAYED_NB or -errno.
//
//export mpi5kGoConnect
func mpi5kGoConnect(fd C.int, sa *C.struct_sockaddr, salen C.socklen_t) C.int {
	var ep C.struct_mpi5k_ep
	if C.mpi5k_sockaddr_to_ep(sa, salen, &ep) == 0 {
		return C.MPI5K_PASS
	}
	return C.int(relayConnect(int(fd), epToAddrPort(&ep)))
}

// mpi5kGoPeerQuery asks the gateway that connected to fd (seen) who the
// true source is. Returns 1 and fills out when the gateway knows.
//
//export mpi5kGoPeerQuery
func mpi5kGoPeerQuery(fd C.int, seen *C.struct_mpi5k_ep, out *C.struct_mpi5k_ep) C.int {
	src, site, ok := peerQuery(int(fd), epToAddrPort(seen))
	if !ok {
		return 0
	}
	addrPortToEp(src, out)
	out.site = C.uint8_t(site)
	return 1
}

// mpi5kGoListen registers the port of fd, which now listens, with the
// site gateway (listen.go).
//
//export mpi5kGoListen
func mpi5kGoListen(fd C.int) { listenRegister(int(fd)) }

// allowLoopback: MPI5K_TEST_ALLOW_LOOPBACK is set (tests only).
func allowLoopback() bool { return C.mpi5k_allow_loopback() != 0 }

func epToAddrPort(ep *C.struct_mpi5k_ep) netip.AddrPort {
	b := (*[16]byte)(unsafe.Pointer(&ep.addr[0]))
	switch ep.family {
	case 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), uint16(ep.port))
	case 6:
		return netip.AddrPortFrom(netip.AddrFrom16(*b), uint16(ep.port))
	}
	return netip.AddrPort{}
}

func addrPortToEp(ap netip.AddrPort, ep *C.struct_mpi5k_ep) {
	*ep = C.struct_mpi5k_ep{}
	a := ap.Addr().Unmap()
	b := (*[16]byte)(unsafe.Pointer(&ep.addr[0]))
	ep.port = C.uint16_t(ap.Port())
	if a.Is4() {
		ep.family = 4
		v := a.As4()
		copy(b[:], v[:])
	} else if a.Is6() {
		ep.family = 6
		*b = a.As16()
	}
}

// setGateways tells the C side which peer addresses are local gateways, so
// accept() enters Go only for connections that come from one.
func setGateways(addrs []netip.AddrPort) {
	if len(addrs) == 0 {
		return
	}
	eps := make([]C.struct_mpi5k_ep, len(addrs))
	for i, a := range addrs {
		addrPortToEp(a, &eps[i])
	}
	C.mpi5k_set_gateways(&eps[0], C.int(len(eps)))
}
