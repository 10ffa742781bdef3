#!/usr/bin/env bash
# hack/release.sh VERSION: writes a release into dist/ (make release).
#
#   install.yaml                              CRD, RBAC and manager for image idc-operator:VERSION
#   idc-operator-VERSION.tgz                  the Helm chart
#   kubectl-idc_vVERSION_<os>_<arch>.tar.gz   the plugin, one per PLUGIN_PLATFORMS entry
#   kubectl-idc.krew.yaml                     its krew manifest, URLs and SHA-256s filled in
#   idc-operator-image_vVERSION.tar           the image (OCI archive), and .digest beside it
#   sbom/<binary>.cdx.json                    CycloneDX SBOM of each binary (from its build info)
#   sbom/idc-operator-image.cdx.json          the image's: its three binaries and their modules
#   SHA256SUMS                                every file above
#
# One commit gives the same bytes: binaries are built with -trimpath and no
# VCS stamping, every archive takes the commit time (SOURCE_DATE_EPOCH), no
# owners and sorted names, gzip stores no name or time, and the SBOMs carry
# no serial number or timestamp. A release is cut from a clean tree whose
# VERSION is the committed one and whose CHANGELOG.md has its section.
set -euo pipefail
export GOTOOLCHAIN=go1.27.3 GOFLAGS=${GOFLAGS:--buildvcs=false}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${1:?usage: hack/release.sh VERSION}
dist=${DIST:-$root/dist}
bin=${LOCALBIN:-$root/bin}

die() { echo "release: $*" >&2; exit 1; }

[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "VERSION=$version is not a semantic version (x.y.z)"
committed=$(sed -n 's/^VERSION ?= //p' Makefile)
[[ $version == "$committed" ]] || die "VERSION=$version is not the version the Makefile names ($committed): set 'VERSION ?= $version' in the Makefile, run 'make manifests', add '## [$version]' to CHANGELOG.md with its upgrade notes, commit, then run 'make release VERSION=$version'"
# IDC_RELEASE_REHEARSAL=1 (make test-release): the same build from the work
# tree as it is, without the clean-tree and CHANGELOG checks.
rehearsal=${IDC_RELEASE_REHEARSAL:-}
[[ -n $rehearsal ]] || grep -q "^## \[$version\]" CHANGELOG.md || die "CHANGELOG.md has no '## [$version]' section: add it, with its 'Upgrade notes', and commit"
[[ -n $rehearsal ]] || grep -A200 "^## \[$version\]" CHANGELOG.md | sed '1d;/^## \[/,$d' | grep -q '^### Upgrade notes' ||
  die "CHANGELOG.md's [$version] section has no '### Upgrade notes': say what rolls, what the schema does, what was removed (or 'none')"
if [[ -z $rehearsal ]] && [[ -n $(git status --porcelain --untracked-files=no) ]]; then
  die "the work tree has uncommitted changes: a release is built from a commit (git status)"
fi

make_() { make --no-print-directory VERSION="$version" IMG="idc-operator:$version" "$@"; }

rm -rf "$dist"
mkdir -p "$dist/sbom"
epoch=$(git log -1 --format=%ct)

# The manifests, then check that generating them changed nothing: the
# release is of what is committed.
make_ build-installer >/dev/null
if [[ -z $rehearsal ]] && [[ -n $(git status --porcelain --untracked-files=no) ]]; then
  git status --short >&2
  die "make manifests changed committed files: run 'make manifests generate' and commit"
fi
[[ $dist == "$root/dist" ]] || mv "$root/dist/install.yaml" "$dist/install.yaml"

# The plugin archives (make dist-plugin writes them into ./dist).
make_ dist-plugin >/dev/null
if [[ $dist != "$root/dist" ]]; then
  mv "$root"/dist/kubectl-idc_v"$version"_* "$dist/"
fi
rm -f "$dist"/kubectl-idc_*.sha256

# The krew manifest, rendered as krew-release-bot would render it for the
# tag v$version, with the archives' own SHA-256s.
tag=v$version
krew=$(sed -e '/^#/d' -e "s/{{ \.TagName }}/$tag/g" plugins/krew/idc.yaml)
while read -r url; do
  file=${url##*/}
  [[ -f $dist/$file ]] || die "the krew manifest names $file, which make dist-plugin did not write"
  sum=$(sha256sum "$dist/$file" | cut -d' ' -f1)
  krew=${krew//"{{addURIAndSha \"$url\" .TagName }}"/"uri: $url
    sha256: $sum"}
done < <(grep -o 'addURIAndSha "[^"]*"' <<<"$krew" | sed 's/addURIAndSha "//;s/"$//')
grep -q '{{' <<<"$krew" && die "the krew manifest still holds a template after rendering"
printf '%s\n' "$krew" > "$dist/kubectl-idc.krew.yaml"

# The image, and the binaries it holds for the SBOMs.
make_ image >/dev/null
cp "$bin/idc-operator-image.tar" "$dist/idc-operator-image_$tag.tar"
digest=$(cat "$bin/idc-operator-image.tar.digest")
echo "$digest" > "$dist/idc-operator-image_$tag.tar.digest"

# The chart: helm package validates it; the archive is then written again
# with the commit time, no owners and sorted names (helm stamps the time of
# the build).
make_ helm >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${HELM:-$bin/helm}" package charts/idc-operator --version "$version" --app-version "$version" -d "$tmp" >/dev/null
mkdir "$tmp/x"
tar -xzf "$tmp/idc-operator-$version.tgz" -C "$tmp/x"
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode='u+rw,go+r,go-w' -C "$tmp/x" -cf - idc-operator |
  gzip -n -9 > "$dist/idc-operator-$version.tgz"

# SBOMs: each binary's from the build info it carries (what `go version -m`
# prints), and the image's from those three; hack/sbom checks that every
# module the build info names is in the SBOM.
sbomtool=$bin/idc-sbom
(cd hack/sbom && go build -trimpath -o "$bin/cyclonedx-gomod" github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod && go build -trimpath -o "$sbomtool" .)
args=()
for b in manager idc-runtime kubectl-idc; do
  "$bin/cyclonedx-gomod" bin -json -noserial -notimestamp -version "$tag" -output "$dist/sbom/$b.cdx.json" "$bin/linux/$b"
  args+=("$b=$bin/linux/$b=$dist/sbom/$b.cdx.json")
done
"$sbomtool" -image "idc-operator:$version" -digest "$digest" -out "$dist/sbom/idc-operator-image.cdx.json" "${args[@]}"

(cd "$dist" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
echo "release $version in $dist:"
cat "$dist/SHA256SUMS"
