package main

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
)

// A rank's listening ports are the destinations streams from other sites
// may reach (docs/security.md): when the process listens on a TCP socket
// bound to an address of this host, the shim registers the port with its
// site's gateway (LISTEN on the control connection it also uses for peer
// queries) and waits for the answer, so the gateway knows the port before
// the rank can publish it (MPI's modex). The registration lasts while the
// control connection is open, that is while the process lives.

// listenRegister registers the port fd listens on, if it is a TCP socket
// bound to a non-loopback address (or the wildcard). A failure is logged:
// the listener works, and only streams from other sites to it are refused.
func listenRegister(fd int) {
	c := getConfig()
	if c == nil {
		return
	}
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return
	}
	ap := sockaddrToAddrPort(sa)
	if !ap.IsValid() || ap.Addr().IsLoopback() && !allowLoopback() {
		return // not TCP/IP, or only this host can connect
	}
	// Every gateway host of the site may carry a stream to the port (the
	// far gateway picks one per stream), so each must know it.
	for _, gw := range c.gws {
		if err := registerPort(c, gw, ap.Port()); err != nil {
			logf(levelWarn, "listening on %v: the site gateway %s does not know the port, so ranks of other sites cannot connect to it through that gateway: %v",
				ap, gw, err)
		}
	}
}

// registerPort registers port with the site gateway at gw, on the
// process's control connection to it.
func registerPort(c *config, gw netip.AddrPort, port uint16) error {
	pc := controlClient(gw)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var err error
	for attempt := 0; attempt < 2; attempt++ { // once more on a fresh connection
		if err = pc.ensure(c.timeout); err != nil {
			continue
		}
		var p []byte
		if p, err = pc.exchange(header.TypeListen, header.AppendListen(nil, port), header.TypeListenReply, c.timeout); err != nil {
			continue
		}
		switch p[0] {
		case header.ListenOK:
			pc.ports = append(pc.ports, port)
			return nil
		case header.ListenPrivileged:
			return fmt.Errorf("the gateway refuses privileged port %d", port)
		case header.ListenLimit:
			return fmt.Errorf("the gateway refuses more ports from this process")
		case header.ListenOwner:
			return fmt.Errorf("the node daemon refuses port %d: it does not listen for this process's user", port)
		case header.ListenPort:
			return fmt.Errorf("the gateway refuses port %d: outside its --lan-listen-ports (have the MPI library listen there, e.g. Open MPI's btl_tcp_port_min_v4, or widen the option)", port)
		default:
			return fmt.Errorf("the gateway answered code %d", p[0])
		}
	}
	return err
}
