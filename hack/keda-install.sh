#!/usr/bin/env bash
# make keda: KEDA v2.21.0 as real pods on the real node (hack/node.sh): its
# operator and metrics API server built from the Go module proxy
# (hack/build-keda.sh), put in an image without Docker (hack/image) and
# imported into the node's containerd; its CRDs, RBAC and APIService
# v1beta1.external.metrics.k8s.io applied from KEDA's own config/ in the Go
# module cache. Idempotent; waits until the external metrics API answers.
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
root=$(cd "$(dirname "$0")/.." && pwd)
version=${KEDA_VERSION:-2.21.0}
image=idc.local/keda:$version
log() { printf '[keda %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

"$root/hack/node.sh" running || { echo "the real node is not running: make node-up" >&2; exit 1; }
export KUBECONFIG
KUBECONFIG=$("$root/hack/node.sh" kubeconfig)
kubectl=$("$root/hack/build-node.sh")/kubectl

bin=$("$root/hack/build-keda.sh")
tar=$root/bin/keda-image-$version.tar
if [[ ! -f $tar || $tar -ot $bin/.stamp ]]; then
  (cd "$root" && go run ./hack/image -tag "$image" -out "$tar" -base \
    -file /keda="$bin/keda" -file /keda-adapter="$bin/keda-adapter" \
    -entrypoint /keda -user 65532:65532 -created 0 -label org.opencontainers.image.version="$version")
fi
"$root/hack/node.sh" import "$tar"

kcfg=$(cd "$root/hack/keda" && go mod download -json "github.com/kedacore/keda/v2@v$version" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')/config
[[ -d $kcfg ]] || { echo "KEDA's config/ not found in the module cache ($kcfg)" >&2; exit 1; }
log "applying KEDA v$version from $kcfg"
"$kubectl" apply --server-side -f "$kcfg/general/namespace.yaml" >/dev/null
"$kubectl" apply --server-side -f "$kcfg/crd/bases" >/dev/null
for f in service_account/service_account.yaml rbac/role.yaml rbac/role_binding.yaml \
  metrics-server/role.yaml metrics-server/role_binding.yaml metrics-server/service.yaml metrics-server/api_service.yaml; do
  "$kubectl" apply --server-side -f "$kcfg/$f" >/dev/null
done
sed "s|KEDA_IMAGE|$image|" "$root/hack/keda/keda.yaml" | "$kubectl" apply --server-side -f - >/dev/null
log "waiting for the operator, the metrics API server and the external metrics API"
"$kubectl" -n keda rollout status deployment/keda-operator --timeout=180s >&2
"$kubectl" -n keda rollout status deployment/keda-metrics-apiserver --timeout=240s >&2
"$kubectl" wait --for=condition=Available apiservice/v1beta1.external.metrics.k8s.io --timeout=120s >&2
"$kubectl" get --raw /apis/external.metrics.k8s.io/v1beta1 >/dev/null
log "KEDA v$version is running"
