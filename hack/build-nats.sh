#!/usr/bin/env bash
# Builds nats-server (the current release, the default server of the test
# suites; internal/natstest starts it) from the Go module proxy into
# bin/nats/<version>-<os>-<arch>/ and prints that directory. The wrapper
# module hack/nats pins the server's module graph; the binary is nats-server's
# unmodified main package. Cold: ~15 s (the modules downloaded). Warm (the binary present
# and built from the same go.mod/go.sum): instant. Safe to run concurrently
# (test packages that find the binary missing run it): one build at a time,
# the binary moved into place whole.
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
export GOFLAGS=${GOFLAGS:--buildvcs=false}
root=$(cd "$(dirname "$0")/.." && pwd)
# The version is hack/nats/go.mod's: one place to move it.
version=$(sed -n 's/^require github.com\/nats-io\/nats-server\/v2 v\(.*\)$/\1/p; s/^[[:space:]]*github.com\/nats-io\/nats-server\/v2 v\([^ ]*\).*$/\1/p' "$root/hack/nats/go.mod" | head -1)
[[ -n $version ]] || { echo "no nats-server version in hack/nats/go.mod" >&2; exit 1; }
out="$root/bin/nats/$version-$(go env GOOS)-$(go env GOARCH)"
# The stamp holds the hash of the module graph the binary was built from:
# a fresh clone (new file times) reuses it, a changed go.sum rebuilds.
want=$(cat "$root/hack/nats/go.mod" "$root/hack/nats/go.sum" | sha256sum | cut -c1-16)
fresh() { [[ -x "$out/nats-server" && "$(cat "$out/.stamp" 2>/dev/null)" == "$want" ]]; }
if fresh; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if fresh; then # built by another caller while this one waited
  echo "$out"
  exit 0
fi
cd "$root/hack/nats"
echo "building nats-server v$version into $out" >&2
start=$(date +%s)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/nats-io/nats-server/v2/server.gitCommit=v$version" \
  -o "$out/nats-server.tmp" github.com/nats-io/nats-server/v2
mv -f "$out/nats-server.tmp" "$out/nats-server"
echo "nats-server v$version built in $(( $(date +%s) - start )) s" >&2
echo "$want" >"$out/.stamp"
echo "$out"
