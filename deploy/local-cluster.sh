#!/usr/bin/env bash
# Starts a local cluster on loopback: a Redis of its own, three chatgate
# replicas sharing it and nginx with plain round-robin in front
# (deploy/nginx-round-robin.conf). Ctrl-C stops everything.
#
#   cargo build --release && deploy/local-cluster.sh
#   # the chat page and the API: http://127.0.0.1:8000/
#
# Needs redis-server and nginx (Debian: apt-get install redis-server
# nginx-light). Extra arguments go to every replica, e.g. --engine openai.
set -euo pipefail
cd "$(dirname "$0")/.."

# CHATGATE_BIN, else the build in $CARGO_TARGET_DIR (default target/).
target=${CARGO_TARGET_DIR:-target}
bin=${CHATGATE_BIN:-$target/release/chatgate}
[ -x "$bin" ] || bin=$target/debug/chatgate
[ -x "$bin" ] || { echo "build chatgate first: cargo build --release (looked in $target/; or set CHATGATE_BIN)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 1; }
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || { echo "nginx is not installed" >&2; exit 1; }

redis_port=6390
# Every port must be free: a server already there would pass for ours.
for port in "$redis_port" 8081 8082 8083 8000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "127.0.0.1:$port is taken by another process: stop it first" >&2
    exit 1
  fi
done

dir=$(mktemp -d -t chatgate-cluster-XXXX)
secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT INT TERM

# Append-only and synced: a decision acknowledged survives a Redis restart.
redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir" \
  --appendonly yes --appendfsync always --save "" >"$dir/redis.log" 2>&1 &
pids+=($!)
sleep 0.5

replicas=()
for i in 1 2 3; do
  port=808$i
  "$bin" --bind "127.0.0.1:$port" --store "redis://127.0.0.1:$redis_port/0" \
    --replica-id "replica-$i" --advertise-url "http://127.0.0.1:$port" \
    --cluster-secret "$secret" "$@" \
    >"$dir/replica-$i.log" 2>&1 &
  pids+=($!)
  replicas+=($!)
done
# Each replica must be up: its own process alive, and ready.
for i in 1 2 3; do
  pid=${replicas[$((i - 1))]}
  ready=
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    if curl -fs "http://127.0.0.1:808$i/readyz" >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.1
  done
  if [ -z "$ready" ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "replica-$i did not start on 127.0.0.1:808$i; its log:" >&2
    tail -n 5 "$dir/replica-$i.log" >&2
    exit 1
  fi
done

mkdir -p "$dir/nginx"
cat >"$dir/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/nginx/body;
    proxy_temp_path $dir/nginx/proxy;
    include $PWD/deploy/nginx-round-robin.conf;
}
CONF
"$nginx" -p "$dir/nginx" -e "$dir/nginx/error.log" -c "$dir/nginx/nginx.conf" &
pids+=($!)

echo "redis on 127.0.0.1:$redis_port; replicas on 127.0.0.1:8081-8083; logs in $dir"
echo "chatgate (round-robin over three replicas): http://127.0.0.1:8000/  (Ctrl-C stops)"
wait
