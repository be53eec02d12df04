#!/bin/sh
# 5 rounds alternating base/new: BenchmarkStream (relay), PingPong and Forward (gateway)
for r in 1 2 3 4 5; do
 for v in base new; do
  echo "=== round $r $v $(date -u +%T)"
  (cd /tmp/base-stages/relay && /tmp/stages-bin/relay-$v.test -test.run '^$' -test.bench 'Stream/pipeline=2' -test.benchtime 2000x 2>&1 | grep '^Benchmark')
  (cd /tmp/base-stages/gateway && /tmp/stages-bin/gateway-$v.test -test.run '^$' -test.bench 'PingPong/(direct|gateway)$' -test.benchtime 20000x 2>&1 | grep '^Benchmark')
  (cd /tmp/base-stages/gateway && /tmp/stages-bin/gateway-$v.test -test.run '^$' -test.bench 'Forward/chunk=(64|128)KiB' -test.benchtime 1000x 2>&1 | grep '^Benchmark')
 done
done
