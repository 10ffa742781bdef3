#!/usr/bin/env bash
# hack/e2e-failed.sh LOG: after a failed e2e run, prints each failed step's own
# last lines (its errors come last, before the suite's cluster dump), so that
# they end the output instead of scrolling out under the dump. The whole run
# stays in LOG.
set -euo pipefail
log=${1:?usage: hack/e2e-failed.sh LOG}
steps=$(sed -n 's/^ *--- FAIL: TestRealNode\/\([^ ]*\) .*/\1/p' "$log")
if [[ -z $steps ]]; then
  echo "=== the e2e suite failed outside any step; its last lines (whole run: $log):"
  grep -v '^ *{"level"' "$log" | tail -n 25
  exit 0
fi
for step in $steps; do
  echo "=== e2e step $step failed; its last lines before the cluster dump (whole run: $log):"
  # From the step's RUN line to the dump the suite logs after it (or the next
  # step), without the components' JSON log lines.
  awk -v run="=== RUN   TestRealNode/$step" '
    index($0, run) == 1 { on = 1; next }
    on && (/^=== RUN / || /=== the cluster when step /) { exit }
    on && !/^ *\{"level"/ { print }
  ' "$log" | tail -n 25
done
