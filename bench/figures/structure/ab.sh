#!/bin/sh
# Rounds alternating base/new: BenchmarkStream (relay), PingPong and Forward
# (gateway). BIN holds {relay,gateway}-{base,new}.test (go test -c in each
# checkout); SRC is a checkout whose relay/ and gateway/ the binaries run in.
BIN=${BIN:-/tmp/stages-bin}
SRC=${SRC:-/tmp/base-stages}
ROUNDS=${ROUNDS:-5}
for r in $(seq 1 "$ROUNDS"); do
 for v in base new; do
  echo "=== round $r $v $(date -u +%T)"
  (cd "$SRC/relay" && "$BIN/relay-$v.test" -test.run '^$' -test.bench 'Stream/pipeline=2' -test.benchtime 2000x 2>&1 | grep '^Benchmark')
  (cd "$SRC/gateway" && "$BIN/gateway-$v.test" -test.run '^$' -test.bench 'PingPong/(direct|gateway)$' -test.benchtime 20000x 2>&1 | grep '^Benchmark')
  (cd "$SRC/gateway" && "$BIN/gateway-$v.test" -test.run '^$' -test.bench 'Forward/chunk=(64|128)KiB' -test.benchtime 1000x 2>&1 | grep '^Benchmark')
 done
done
