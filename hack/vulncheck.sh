#!/usr/bin/env bash
# govulncheck against a local Go vulnerability database, on the source and on
# both binaries (make build first). The database website is not reachable from
# here; the golang.org/x/vulndb module is served by the Go module proxy and its
# cmd/indexdb builds the database that `govulncheck -db file://...` reads. Both
# tools and the database come from hack/vulncheck/go.mod (its versions are the
# pins) and are cached under bin/vulncheck/ until that go.sum changes.
# Fails on a called vulnerability that hack/vulncheck-allow.txt does not list.
# Cold: about 4 minutes to build the tools, 20 s for the database.
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
export GOFLAGS=${GOFLAGS:--buildvcs=false}
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/bin/vulncheck"
db="$tools/db"
allow="$root/hack/vulncheck-allow.txt"
stamp="$root/hack/vulncheck/go.sum"

if [[ ! -x "$tools/govulncheck" || ! -x "$tools/indexdb" || ! -x "$tools/gate" || "$stamp" -nt "$tools/.stamp" ]]; then
  echo "building govulncheck, indexdb and the gate into $tools" >&2
  mkdir -p "$tools"
  (cd "$root/hack/vulncheck" && go build -trimpath -o "$tools/" golang.org/x/vuln/cmd/govulncheck golang.org/x/vulndb/cmd/indexdb ./gate)
  touch "$tools/.stamp"
fi
if [[ ! -f "$db/index/db.json" || "$stamp" -nt "$db/.stamp" ]]; then
  osv=$(cd "$root/hack/vulncheck" && go mod download -json golang.org/x/vulndb | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  echo "building the vulnerability database from $osv/data/osv into $db" >&2
  rm -rf "$db"
  start=$(date +%s)
  "$tools/indexdb" -vulns "$osv/data/osv" -out "$db"
  touch "$db/.stamp"
  echo "database built in $(($(date +%s) - start)) s ($(ls "$osv/data/osv" | wc -l) OSV entries)" >&2
fi

rc=0
scan() { # target, then govulncheck's arguments
  local target=$1
  shift
  "$tools/govulncheck" -db "file://$db" -format json "$@" | "$tools/gate" -allow "$allow" -target "$target" || rc=1
}
cd "$root"
scan source ./...
for bin in bin/manager bin/idc-runtime; do
  [[ -f $bin ]] || { echo "$bin is missing: make build first" >&2; exit 2; }
  scan "$bin" -mode binary "$bin"
done
exit $rc
