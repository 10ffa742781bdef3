#!/usr/bin/env bash
# hack/release/build-previous.sh [OUT]: rebuilds the previous release that
# hack/release/previous records (version=, commit=) from its commit, in a
# git worktree of that commit, and copies what the upgrade e2e installs into
# OUT (default bin/previous/VERSION): idc-operator-image.tar (+ .id),
# install.yaml and the Helm chart (chart/). It prints OUT. A directory
# already built from the same commit is reused (one commit gives the same
# bytes: make test-release).
set -euo pipefail
export GOTOOLCHAIN=go1.27.3 GOFLAGS=-buildvcs=false
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^version=//p' "$root/hack/release/previous")
commit=$(sed -n 's/^commit=//p' "$root/hack/release/previous")
[[ -n $version && ${#commit} == 40 ]] || { echo "hack/release/previous needs version= and a full commit=" >&2; exit 1; }
out=${1:-$root/bin/previous/$version}
if [[ -f $out/install.yaml && -f $out/idc-operator-image.tar.id && $(cat "$out/commit" 2>/dev/null) == "$commit" ]]; then
  echo "$out"
  exit 0
fi
if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  # A shallow clone lacks the release's commit: fetch it (or the history).
  git -C "$root" fetch --quiet origin "$commit" 2>/dev/null || git -C "$root" fetch --quiet --unshallow 2>/dev/null || true
  git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null || {
    echo "the previous release's commit $commit ($version) is not in this clone and could not be fetched: clone with its history (no --depth)" >&2
    exit 1
  }
fi
tmp=$(mktemp -d)
wt=$tmp/idc-operator-$version
git -C "$root" worktree add --quiet --detach "$wt" "$commit" >&2
trap 'git -C "$root" worktree remove --force "$wt" >&2; rm -rf "$tmp"' EXIT
mkdir -p "$wt/bin"
# The cluster binaries and code generators are the same tools whatever the
# commit (the Makefile pins their versions); link them instead of rebuilding.
for tool in k8s controller-gen crd-ref-docs; do
  [[ -e $root/bin/$tool ]] && ln -s "$(readlink -f "$root/bin/$tool")" "$wt/bin/$tool"
done
img=idc-operator:$version
make -C "$wt" --no-print-directory image IMG="$img" VERSION="$version" >&2
make -C "$wt" --no-print-directory build-installer IMG="$img" VERSION="$version" >&2
rm -rf "$out" && mkdir -p "$out"
cp "$wt/bin/idc-operator-image.tar" "$wt/bin/idc-operator-image.tar.id" "$wt/dist/install.yaml" "$out/"
cp -r "$wt/charts/idc-operator" "$out/chart"
echo "$commit" >"$out/commit"
echo "$out"
