// Package wrap turns an unmodified mpirun command line into a run through
// the mpi5k gateways: it finds the MPI flavour and the host list, assigns
// hosts to sites, writes the site map, starts one gateway per site, injects
// the preload the way the flavour propagates environment, and tears it all
// down again. scripts/mpirun-wrap and `mpi5k run` are its front ends.
//
// Each launcher family is a Flavour of its own, in launch_<family>.go: how
// its command line names hosts (options, hostfile syntax), how it passes
// environment to the ranks, how it starts its daemons over oarsh. The rest
// of the package asks the flavour and never which one it is; flavours in
// flavour.go lists them for detection and --flavour, and batch.go the batch
// systems' node lists.
//
// Run is one path from command line to summary (run.go). A placement
// (placement.go) puts the hosts into sites: a plan made from the host
// names, --sites and --gateway, or a site map written by hand (--map,
// usermap.go), whose sites may already run their gateways. From there the
// site map, the keys (keys.go), the launcher's command line, the dry run,
// the gateways' start (start.go, gateways.go) and the summary (summary.go)
// are the same for both.
package wrap
