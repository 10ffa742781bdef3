#!/usr/bin/env bash
# kube-score (built from the Go module proxy, hack/kubescore/go.mod) on
# dist/install.yaml, the Helm chart's default render and the children a
# consumer gets (rendered by the controller's own functions). Fails on a
# CRITICAL finding other than those the README explains (Security,
# kube-score): no CPU limits, no memory limit on consumer pods (sized per
# resource in spec.runtime.resources), imagePullPolicy not Always.
# With KUBECONFIG set and LIVE=1 it also scores the live children of every
# IdempotentConsumer (kubectl get deploy,cronjob,pdb,networkpolicy -A -l
# app.kubernetes.io/managed-by=idc-operator).
set -euo pipefail
export GOTOOLCHAIN=go1.27.3
export GOFLAGS=${GOFLAGS:--buildvcs=false}
root=$(cd "$(dirname "$0")/.." && pwd)
ks=${KUBE_SCORE:-$root/bin/kube-score}
helm=${HELM:-$root/bin/helm}
kubectl=${KUBECTL:-kubectl}
out=$root/bin/kube-score-input
mkdir -p "$out"
"$helm" template idc "$root/charts/idc-operator" -n idc-system > "$out/chart.yaml"
(cd "$root" && IDC_CHILDREN_OUT="$out/children.yaml" go test -count=1 -run '^TestRenderedChildrenForKubeScore$' ./controllers >/dev/null)
inputs=("$root/dist/install.yaml" "$out/chart.yaml" "$out/children.yaml")
if [[ ${LIVE:-} == 1 ]]; then
  "$kubectl" get deploy,cronjob,pdb,networkpolicy -A -l app.kubernetes.io/managed-by=idc-operator -o yaml > "$out/live.yaml"
  inputs+=("$out/live.yaml")
fi
rc=0
explained=(-e 'CPU limit is not set' -e 'ImagePullPolicy is not set to Always'
  -e '(runtime) Memory limit is not set' -e '(prune) Memory limit is not set' -e '(redrive) Memory limit is not set')
for f in "${inputs[@]}"; do
  extra=()
  # Consumer NetworkPolicies are opt-in (--network-policies): a live
  # cluster's consumers may have none (README).
  [[ $f == "$out/live.yaml" ]] && extra=(-e 'does not have a matching NetworkPolicy')
  echo "== kube-score $f"
  report=$("$ks" score "$f" --output-format ci || true)
  grep -v '^\[OK\]\|^\[SKIPPED\]' <<<"$report" || true
  unexplained=$(grep '^\[CRITICAL\]' <<<"$report" | grep -v "${explained[@]}" "${extra[@]}" || true)
  if [[ -n $unexplained ]]; then
    echo "CRITICAL findings the README does not explain in $f:" >&2
    echo "$unexplained" >&2
    rc=1
  fi
done
exit $rc
