#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for the e2e suite and
# the demo: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kube-proxy built from the Go module proxy (hack/build-envtest.sh,
# hack/build-node.sh), a PRIVATE containerd (own root, state and socket; the
# machine's /etc/containerd and daemon are left alone), a CNI bridge, a forward
# guard so that nothing routed through the bridge ever reaches the external
# interface, and socat forwards that expose the machine's loopback-only
# services (PostgreSQL, NATS, RabbitMQ + management API, Redis) on the bridge
# gateway IP.
#
#   hack/node.sh up           start (idempotent); imports bin/*-image.tar; prints the kubeconfig path
#   hack/node.sh down         stop what `up` started (by recorded PID) and remove every trace
#   hack/node.sh check-clean  print what is left of a node; exit 1 if anything is
#   hack/node.sh status       components and their PIDs
#   hack/node.sh running      exit 0 when the node runs
#   hack/node.sh import FILE  import an image archive into the node's containerd
#
# Everything lives under $IDC_NODE_DIR (default bin/node). Needs root.
# The node's facts (why a private containerd, cgroup v1, the guard, ...) are in
# docs/development.md, "Try it on a real node here".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
N=${IDC_NODE_DIR:-$root/bin/node}
# The kernel lists mounts by their real path: with bin/ a symlink, the
# teardown's and check-clean's /proc/self/mountinfo greps must match that,
# or they miss (and leave) the kubelet's mounts.
N=$(realpath -m "$N")
NODE=${IDC_NODE_NAME:-idc-node}
BRIDGE=${IDC_NODE_BRIDGE:-idc0}
GW=10.88.0.1
GUARD=IDC-NODE-GUARD
SOCK=$N/run/containerd/containerd.sock
ST=$N/state
L=$N/logs
V=$N/var
K=$N/kubeconfig
P=$N/pki
# Host services forwarded to pods on $GW: PostgreSQL, MariaDB, NATS, RabbitMQ AMQP,
# Redis, RabbitMQ management API.
FORWARDS=(5432 3306 4222 5672 6379 15672)
APT_PACKAGES=(containerd runc containernetworking-plugins socat iptables openssl iproute2 curl)

log() { printf '[node %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [[ $(id -u) == 0 ]] || die "the node needs root (network bridge, iptables, cgroups, mounts)"; }

ensure_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$N/apt.log" 2>&1 ||
    { apt-get update -q >>"$N/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$N/apt.log" 2>&1; } ||
    die "apt-get install ${missing[*]} failed; see $N/apt.log"
}

ext_if() { ip -4 route show default 2>/dev/null | awk '{for (i=1;i<NF;i++) if ($i=="dev") {print $(i+1); exit}}'; }

# alive NAME: the recorded PID runs the binary we started (never trust a stale
# PID file: the number may belong to someone else's process now).
alive() {
  local f=$ST/$1.pid pid exe
  [[ -f $f && -f $ST/$1.exe ]] || return 1
  pid=$(<"$f")
  kill -0 "$pid" 2>/dev/null || return 1
  exe=$(<"$ST/$1.exe")
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]]
}

start() { # name binary args...
  local name=$1 bin=$2
  shift 2
  setsid "$bin" "$@" >"$L/$name.log" 2>&1 </dev/null &
  echo $! >"$ST/$name.pid"
  readlink -f "$bin" >"$ST/$name.exe"
}

waitfor() { # what seconds cmd...
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 4; i++)); do
    if "$@" >/dev/null 2>&1; then
      log "$what ($(($(date +%s) - t0))s)"
      return 0
    fi
    sleep 0.25
  done
  die "timed out after ${secs}s waiting for $what; logs in $L"
}

render() { # template -> output
  sed -e "s#@DIR@#$N#g" -e "s#@NODE@#$NODE#g" -e "s#@BRIDGE@#$BRIDGE#g" "$1" >"$2"
}

pki() {
  [[ -f $P/ca.crt && -f $P/front-proxy-client.crt && -f $K/admin.kubeconfig ]] && return 0
  mkdir -p "$P" "$K"
  (
    cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=idc-node-ca" 2>/dev/null
    printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
    cat >apiserver.ext <<EOT
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$GW,IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOT
    sign() { # name subject extfile
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 -extfile "$3" 2>/dev/null
      rm -f "$1.csr"
    }
    sign apiserver "/CN=kube-apiserver" apiserver.ext
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client.ext
    sign admin "/O=system:masters/CN=idc-node-admin" client.ext
    sign controller-manager "/CN=system:kube-controller-manager" client.ext
    sign scheduler "/CN=system:kube-scheduler" client.ext
    sign kube-proxy "/CN=system:kube-proxy" client.ext
    sign kubelet "/O=system:nodes/CN=system:node:$NODE" client.ext
    # The aggregation layer (KEDA's external metrics API, make keda): the
    # API server proxies to an extension API server as front-proxy-client,
    # which that server trusts through the front-proxy CA.
    openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 -subj "/CN=idc-node-front-proxy-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr -subj "/CN=front-proxy-client" 2>/dev/null
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial -out front-proxy-client.crt -days 3650 -extfile client.ext 2>/dev/null
    rm -f front-proxy-client.csr
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
  )
  for u in admin controller-manager scheduler kube-proxy kubelet; do
    cat >"$K/$u.kubeconfig" <<EOT
apiVersion: v1
kind: Config
clusters:
- name: $NODE
  cluster: {server: "https://$GW:6443", certificate-authority: $P/ca.crt}
users:
- name: $u
  user: {client-certificate: $P/$u.crt, client-key: $P/$u.key}
contexts:
- name: $NODE
  context: {cluster: $NODE, user: $u}
current-context: $NODE
EOT
  done
}

guard_up() {
  local ext
  ext=$(ext_if)
  iptables -t mangle -N $GUARD 2>/dev/null || iptables -t mangle -F $GUARD
  if [[ -n $ext ]]; then
    iptables -t mangle -A $GUARD -i "$ext" -j DROP
    iptables -t mangle -A $GUARD -o "$ext" -j DROP
  fi
  # Whatever the external interface is called, nothing forwarded leaves or
  # enters the bridge from anywhere but the bridge itself.
  iptables -t mangle -A $GUARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -t mangle -A $GUARD ! -i "$BRIDGE" -o "$BRIDGE" -j DROP
  iptables -t mangle -C FORWARD -j $GUARD 2>/dev/null || iptables -t mangle -I FORWARD -j $GUARD
}

guard_down() {
  iptables -t mangle -D FORWARD -j $GUARD 2>/dev/null || true
  iptables -t mangle -F $GUARD 2>/dev/null || true
  iptables -t mangle -X $GUARD 2>/dev/null || true
}

net_up() {
  [[ -f $ST/ip_forward.orig ]] || cat /proc/sys/net/ipv4/ip_forward >"$ST/ip_forward.orig"
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr show dev "$BRIDGE" | grep -q "inet $GW/16" || ip addr add $GW/16 dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # The guard goes up BEFORE anything can turn ip_forward on (the bridge
  # plugin does, for isGateway).
  guard_up
  mkdir -p "$N/etc/cni" "$V/cni-ipam"
  render "$root/hack/node/config/10-idc-bridge.conflist" "$N/etc/cni/10-idc-bridge.conflist"
}

images() {
  # The sandbox image: a static Go pause, imported under the name containerd asks for.
  local img=$root/bin/pause-image.tar
  [[ -f $img ]] || make -C "$root" --no-print-directory pause-image >&2
  import "$img"
  if [[ -f $root/bin/idc-operator-image.tar ]]; then
    import "$root/bin/idc-operator-image.tar"
  else
    log "no bin/idc-operator-image.tar yet: run make image (make node-up does)"
  fi
}

import() {
  ctr --address "$SOCK" -n k8s.io images import "$1" >"$L/import.log" 2>&1 ||
    die "importing $1 failed: $(tail -3 "$L/import.log")"
  log "imported $(basename "$1"): $(grep -o 'unpacking [^ ]*' "$L/import.log" | head -3 | tr '\n' ' ')"
}

up() {
  need_root
  mkdir -p "$N" "$ST" "$L" "$V/etcd" "$V/kubelet" "$V/log/pods" "$N/etc/static-pods" "$N/run/containerd"
  if alive kubelet && alive kube-apiserver; then
    log "already up; importing the current image"
    [[ -f $root/bin/idc-operator-image.tar ]] && import "$root/bin/idc-operator-image.tar"
    echo "$K/admin.kubeconfig"
    return 0
  fi
  for p in 6443 2379 2380 10250 10257 10259; do
    if ss -ltnH "sport = :$p" | grep -q .; then die "port $p is taken by another process: is another node running (hack/node.sh status, or a clone elsewhere)?"; fi
  done
  ensure_packages
  # The services the pods use must run before the forwards bind the bridge
  # IP (a service that binds every interface after them would fail).
  "$root/hack/services.sh" ensure >&2 || die "the local services are not all up (hack/services.sh)"
  t0=$(date +%s)
  local envbin nodebin
  envbin=$("$root/hack/build-envtest.sh")
  nodebin=$("$root/hack/build-node.sh")
  # The node runs its own links of the binaries, so that `down` and
  # `check-clean` can tell its processes from any other by their path.
  mkdir -p "$N/bin"
  for b in "$envbin/kube-apiserver" "$envbin/etcd" "$nodebin"/{kubelet,kube-controller-manager,kube-scheduler,kube-proxy,kubectl,cri-clean}; do
    ln -f "$b" "$N/bin/" 2>/dev/null || cp -f "$b" "$N/bin/"
  done
  B=$N/bin
  log "binaries ready ($(($(date +%s) - t0))s)"
  t0=$(date +%s)
  pki
  render "$root/hack/node/config/containerd.toml" "$N/etc/containerd.toml"
  render "$root/hack/node/config/kubelet.yaml" "$N/etc/kubelet.yaml"
  render "$root/hack/node/config/kube-proxy.yaml" "$N/etc/kube-proxy.yaml"
  cp "$root/hack/node/config/resolv.conf" "$N/etc/resolv.conf"
  cp "$root/hack/node/config/audit-policy.yaml" "$N/etc/audit-policy.yaml"
  net_up
  export KUBECONFIG=$K/admin.kubeconfig

  if ! alive containerd; then
    start containerd "$(command -v containerd)" --config "$N/etc/containerd.toml"
    waitfor "containerd up" 30 ctr --address "$SOCK" version
  fi
  images

  start etcd "$B/etcd" --name "$NODE" --data-dir "$V/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "$NODE=http://127.0.0.1:2380" --listen-metrics-urls http://127.0.0.1:2381
  waitfor "etcd healthy" 30 curl -sf http://127.0.0.1:2381/health

  start kube-apiserver "$B/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=$GW --advertise-address=$GW --secure-port=6443 \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
    --client-ca-file="$P/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --audit-policy-file="$N/etc/audit-policy.yaml" --audit-log-path="$L/audit.log" --audit-log-maxsize=200 \
    --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --allow-privileged=false --v=1
  waitfor "kube-apiserver ready" 120 "$B/kubectl" get --raw /readyz

  start kube-controller-manager "$B/kube-controller-manager" \
    --kubeconfig="$K/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$K/controller-manager.kubeconfig" --authorization-kubeconfig="$K/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --service-cluster-ip-range=10.96.0.0/16 --horizontal-pod-autoscaler-sync-period=5s --v=1
  start kube-scheduler "$B/kube-scheduler" \
    --kubeconfig="$K/scheduler.kubeconfig" \
    --authentication-kubeconfig="$K/scheduler.kubeconfig" --authorization-kubeconfig="$K/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --v=1
  # cAdvisor dials a hard-wired containerd socket unless told (hack/envtest/kubelet/main.go).
  KUBELET_CADVISOR_CONTAINERD=$SOCK start kubelet "$B/kubelet" --config="$N/etc/kubelet.yaml" \
    --kubeconfig="$K/kubelet.kubeconfig" --root-dir="$V/kubelet" --cert-dir="$V/kubelet/pki" \
    --hostname-override="$NODE" --node-ip=$GW --v=1
  start kube-proxy "$B/kube-proxy" --config="$N/etc/kube-proxy.yaml" --v=1
  waitfor "kube-controller-manager healthy" 60 curl -skf https://127.0.0.1:10257/healthz
  waitfor "kube-scheduler healthy" 60 curl -skf https://127.0.0.1:10259/healthz
  waitfor "node registered" 120 "$B/kubectl" get node "$NODE"
  waitfor "node Ready" 180 "$B/kubectl" wait --for=condition=Ready "node/$NODE" --timeout=1s
  waitfor "default ServiceAccount" 60 "$B/kubectl" -n default get serviceaccount default

  for port in "${FORWARDS[@]}"; do
    alive "forward-$port" && continue
    # A service that listens on every interface (RabbitMQ's management
    # plugin does by default) is reachable on the bridge already.
    if (exec 3<>"/dev/tcp/$GW/$port") 2>/dev/null; then
      log "port $port already answers on $GW (the service listens on all interfaces): no forward"
      continue
    fi
    start "forward-$port" "$(command -v socat)" "TCP-LISTEN:$port,bind=$GW,fork,reuseaddr" "TCP:127.0.0.1:$port"
  done
  waitfor "host services reachable on $GW" 10 bash -c "for p in ${FORWARDS[*]}; do (exec 3<>/dev/tcp/$GW/\$p) || exit 1; done"
  "$B/kubectl" get nodes -o wide >&2
  echo "$K/admin.kubeconfig"
}

stop() { # name: TERM, wait, KILL; only the recorded PID running our binary
  local name=$1 pid i
  if alive "$name"; then
    pid=$(<"$ST/$name.pid")
    # Each component was started with setsid: its process group is its own
    # (socat's forked per-connection children are in it too).
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 120; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"; log "killed $name ($pid)"; else log "stopped $name ($pid)"; fi
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$ST/$name.pid" "$ST/$name.exe"
}

kube_chains_down() {
  local ipt t rule ch
  for ipt in iptables ip6tables; do
    for t in mangle nat filter; do
      { "$ipt-save" -t $t 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | sed 's/^-A /-D /' | while read -r rule; do
        eval "$ipt -t $t $rule" 2>/dev/null || true
      done
      for ch in $("$ipt-save" -t $t 2>/dev/null | awk -F'[: ]' '/^:KUBE-/{print $2}'); do
        $ipt -t $t -F "$ch" 2>/dev/null || true
        $ipt -t $t -X "$ch" 2>/dev/null || true
      done
    done
  done
}

down() {
  need_root
  [[ -d $N ]] || { log "no node directory $N"; return 0; }
  B=$N/bin
  stop kubelet
  if alive containerd && [[ -S $SOCK ]]; then
    CONTAINER_RUNTIME_ENDPOINT=unix://$SOCK "$B/cri-clean" >"$L/cri-clean.log" 2>&1 || log "cri-clean: $(tail -2 "$L/cri-clean.log")"
  fi
  stop kube-proxy
  [[ -x $B/kube-proxy ]] && "$B/kube-proxy" --cleanup >/dev/null 2>&1 || true
  kube_chains_down
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  for port in "${FORWARDS[@]}"; do stop "forward-$port"; done
  stop containerd
  # Network namespaces the runtime could not remove.
  for n in "$N"/run/containerd/io.containerd.grpc.v1.cri/netns/cni-*; do
    [[ -e $n ]] || continue
    umount "$n" 2>/dev/null || true
    rm -f "$n"
  done
  rm -rf "$V/cni-ipam"
  # Mounts under the node directory (kubelet root bind mount, volumes,
  # containerd overlay snapshots), deepest first.
  { awk '{print $5}' /proc/self/mountinfo | grep "^$N/" || true; } | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done
  # kubepods cgroups (cgroup v1), leaf first.
  for sub in /sys/fs/cgroup/*/; do
    if [[ -d ${sub}kubepods ]]; then find "${sub}kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
  done
  for l in /var/log/containers/*; do
    if [[ -L $l ]] && readlink "$l" | grep -q "^$V/log/pods"; then rm -f "$l"; fi
  done
  # Paths the kubelet and libcni hard-wire outside --root-dir.
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  for d in /var/lib/kubelet/device-plugins /var/lib/kubelet /var/lib/cni/results /var/lib/cni /var/log/containers; do
    rmdir "$d" 2>/dev/null || true
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
  guard_down
  if [[ -f $ST/ip_forward.orig ]]; then
    cat "$ST/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
    rm -f "$ST/ip_forward.orig"
  fi
  # Cluster state goes with the node: the next `up` starts from nothing
  # (images stay in the containerd root and are re-imported anyway).
  rm -rf "$V/etcd" "$V/kubelet" "$V/log" "$N/run"
  log "down"
  check_clean
}

check_clean() {
  local left=0 f pid what
  report() { echo "LEFT: $*"; left=1; }
  for f in "$ST"/*.pid; do
    [[ -f $f ]] || continue
    pid=$(<"$f")
    kill -0 "$pid" 2>/dev/null && report "process $(basename "$f" .pid) (pid $pid)"
  done
  # Any process running a node binary or our containerd/socat forwards.
  for pid in $(pgrep -f "$N/bin/|$N/etc/containerd.toml|containerd-shim-runc-v2 .*$SOCK|TCP-LISTEN:[0-9]+,bind=$GW" || true); do
    [[ $pid == "$$" ]] && continue
    what=$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-120) || continue
    [[ -n $what ]] && report "process $pid: $what"
  done
  while read -r m; do report "mount $m"; done < <(awk '{print $5}' /proc/self/mountinfo | grep "^$N/" || true)
  ip link show "$BRIDGE" >/dev/null 2>&1 && report "bridge $BRIDGE"
  while read -r c; do report "iptables chain $c"; done < <( (iptables-save 2>/dev/null; ip6tables-save 2>/dev/null) | awk -F'[: ]' '/^:(KUBE-|IDC-NODE-)/{print $2}' | sort -u)
  for sub in /sys/fs/cgroup/*/kubepods; do [[ -d $sub ]] && report "cgroup $sub"; done
  if [[ -f $ST/ip_forward.orig ]]; then
    report "ip_forward not restored (now $(cat /proc/sys/net/ipv4/ip_forward), was $(cat "$ST/ip_forward.orig"))"
  fi
  ls "$N"/run/containerd/io.containerd.grpc.v1.cri/netns/cni-* >/dev/null 2>&1 && report "network namespaces under $N/run"
  if ((left)); then
    echo "the node is not clean" >&2
    return 1
  fi
  echo "clean: no node process, mount, bridge, KUBE-*/IDC-NODE-* chain or kubepods cgroup is left; ip_forward is $(cat /proc/sys/net/ipv4/ip_forward)"
}

status() {
  local n
  for n in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy "${FORWARDS[@]/#/forward-}"; do
    if alive "$n"; then echo "$n: running (pid $(<"$ST/$n.pid"))"; else echo "$n: stopped"; fi
  done
  echo "kubeconfig: $K/admin.kubeconfig"
}

case ${1:-} in
up) up ;;
down) down ;;
check-clean) check_clean ;;
status) status ;;
running) alive kubelet && alive kube-apiserver ;;
import) need_root; import "${2:?image archive}" ;;
kubeconfig) echo "$K/admin.kubeconfig" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
