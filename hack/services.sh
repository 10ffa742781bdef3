#!/usr/bin/env bash
# Checks the local services the tests use and, with `ensure`, starts any that is
# down with the command this machine kind documents. `check` only reports and
# fails loudly: tests never skip because a service is missing.
set -uo pipefail
mode=${1:-check}

up() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

start() {
  case $1 in
    postgresql) pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start ;;
    redis) redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log ;;
    rabbitmq) rabbitmq-server -detached ;;
    mariadb) start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd ;;
    nats) start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log ;;
  esac
}

services=("postgresql 127.0.0.1 5432" "redis 127.0.0.1 6379" "rabbitmq 127.0.0.1 5672" "nats 127.0.0.1 4222" "mariadb 127.0.0.1 3306")
failed=0
for s in "${services[@]}"; do
  read -r name host port <<<"$s"
  if up "$host" "$port"; then continue; fi
  if [[ $mode != ensure ]]; then
    echo "service $name is not listening on $host:$port; start it with: make services" >&2
    failed=1
    continue
  fi
  echo "starting $name" >&2
  start "$name"
  for _ in $(seq 1 60); do up "$host" "$port" && break; sleep 1; done
  if ! up "$host" "$port"; then echo "service $name did not come up on $host:$port" >&2; failed=1; fi
done
if [[ $mode == ensure ]] && command -v rabbitmq-plugins >/dev/null; then
  # The management API is how retention is read from RabbitMQ.
  if ! up 127.0.0.1 15672; then
    rabbitmq-plugins enable rabbitmq_management >/dev/null
    for _ in $(seq 1 30); do up 127.0.0.1 15672 && break; sleep 1; done
  fi
fi
# Checked in both modes: retention reads RabbitMQ through its management API.
if ! up 127.0.0.1 15672; then
  echo "the RabbitMQ management API is not listening on 127.0.0.1:15672; enable it with: make services" >&2
  failed=1
fi
exit $failed
