#!/bin/sh
# TestGatewayWAN (b) and (d), -short (3 s bulk), alternating base/new
for r in 1 2 3 4 5; do
 for v in base new; do
  if [ $v = base ]; then d=/tmp/base-stages; b=/tmp/stages-bin/e2e-base-stages.test; else d=/work/wt-stages; b=/tmp/stages-bin/e2e-wt-stages.test; fi
  echo "=== round $r $v $(date -u +%T)"
  (cd $d/e2e && MPI5K_GW_ARGS="--wan-cc bbr" timeout 300 $b -test.run 'TestGatewayWAN$' -test.short -test.v -test.count=1 2>&1 | grep -E '\((b|d)\)|^(---|ok|FAIL|PASS)')
 done
done
