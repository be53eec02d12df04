# MPI workloads (bench/workloads/src/*.c), built once per MPI flavour.
# Included by the top Makefile (`include bench/workloads.mk`), or standalone:
#   make -f bench/workloads.mk bench-bin
# A flavour whose mpicc is missing is skipped with a message, so a machine
# with only one MPI still builds the other.
BIN          ?= bin
BENCH_SRC    := $(wildcard bench/workloads/src/*.c)
BENCH_HDR    := $(wildcard bench/workloads/src/*.h)
BENCH_CFLAGS ?= -O2 -std=c11 -Wall -Wextra -Werror
BENCH_FLAVOURS := openmpi mpich

.PHONY: bench-bin
bench-bin: $(foreach f,$(BENCH_FLAVOURS),$(BIN)/bench/$(f)/mpi5k-workload)

$(BIN)/bench/%/mpi5k-workload: $(BENCH_SRC) $(BENCH_HDR)
	@if command -v mpicc.$* >/dev/null 2>&1; then \
	  mkdir -p $(@D) && echo "mpicc.$* -> $@" && \
	  mpicc.$* $(BENCH_CFLAGS) -o $@ $(BENCH_SRC) -lm; \
	else echo "bench-bin: mpicc.$* not found, skipping $@ (apt-get install lib$*-dev)"; fi
