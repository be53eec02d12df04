// Command shim is libmpi5k.so, the LD_PRELOAD library that sends an
// application's inter-site TCP connections through the mpi5k gateways
// (docs/shim.md). Build: go build -buildmode=c-shared -o bin/libmpi5k.so ./shim
//
// The C interception layer (intercept.c, with trace records filled in
// record.c, address conversions in addr.c, the trace ring in ring.c and the
// start-up scan in gonote.c) handles every interposed call; the
// Go side only decides and performs relayed connects, answers peer queries
// and flushes traces. main is never run: a c-shared library has no main.
//
// The go:debug settings below stop Go 1.26 from keeping /sys/fs/cgroup
// cpu files open in every process to follow CPU limit changes: inside a
// host program those are stray fds that shift its fd numbers, and the shim
// needs no GOMAXPROCS tuning.
//
//go:debug containermaxprocs=0
//go:debug updatemaxprocs=0
package main

func main() {}
