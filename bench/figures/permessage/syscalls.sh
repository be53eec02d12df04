#!/bin/bash
# syscalls.sh BIN BENCH N: each child gateway's system calls, context
# switches and CPU over 3 s in the middle of a benchmark run. BIN is a
# test binary of ./gateway (go test -c), run from gateway/; BENCH a
# -test.bench pattern naming one sub-benchmark; N its -test.benchtime
# (long enough to last past 5.5 s, e.g. 300000x). Needs root for perf's
# syscall tracepoints.
$1 -test.run '^$' -test.bench "$2" -test.benchtime $3 2>/dev/null | grep Bench &
sleep 2.5
bp=$(pgrep -f "^$1 -test.run" | head -1)
for c in $(pgrep -P $bp); do
  echo "== child $c ($(tr '\0' ' ' </proc/$c/environ | grep -o 'MPI5K_GW_CHILD=[^ ]*' | sed 's/.*,\([ab]\),.*/site \1/'))"
  perf stat -x, -e 'syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_futex,syscalls:sys_enter_nanosleep,syscalls:sys_enter_epoll_ctl,context-switches,task-clock' -p $c -- sleep 3 2>&1 | cut -d, -f1,3 &
done
wait
