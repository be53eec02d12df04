// Package workloads holds the C sources of mpi5k-workload, the MPI program
// that reproduces the inter-site traffic of the NAS Parallel Benchmarks (and
// a ping-pong) for the with/without-gateway comparison. The Go package only
// carries the tests that build the program with each MPI flavour and run it
// on loopback; bench/workloads.mk builds bin/bench/<flavour>/mpi5k-workload.
// See bench/README.md for how each workload maps to the real NPB kernel.
package workloads
