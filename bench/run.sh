#!/usr/bin/env bash
# Runs every benchmark scenario against a fresh release server on loopback,
# ROUNDS times (default 3), and prints the raw results; docs/benchmarks.md
# holds the medians. Usage: bench/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
port=18190
addr=127.0.0.1:$port
ulimit -n 20000

cargo build --release -q -p chatgate -p chatgate-bench --bins
bench_bin=target/release/chatgate-bench

# On a machine with 8 cores or more, the server gets cores 0-3 and the
# client the others (taskset), so that neither's work is counted as the
# other's; on fewer, both share every core. The machine is printed first.
cores=$(nproc)
pin_server=()
pin_client=()
placement="server and client share all $cores cores"
if [ "$cores" -ge 8 ] && command -v taskset >/dev/null 2>&1; then
  pin_server=(taskset -c 0-3)
  pin_client=(taskset -c "4-$((cores - 1))")
  placement="server on cores 0-3, client on cores 4-$((cores - 1)) (taskset)"
fi
model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
memory=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
echo "## machine: $cores cores (${model:-unknown CPU}), $memory; $placement"
bench() { "${pin_client[@]}" "$bench_bin" "$@"; }

# start_server [COMMAND...]: chatgate by default.
start_server() {
  if [ $# -eq 0 ]; then set -- target/release/chatgate --bind "$addr" --step-delay-ms 0; fi
  "${pin_server[@]}" "$@" >/dev/null 2>&1 &
  server=$!
  for _ in $(seq 100); do
    curl -fs "http://$addr/healthz" >/dev/null 2>&1 && return
    sleep 0.05
  done
  echo "server did not start" >&2; exit 1
}
stop_server() { kill -TERM "$server"; wait "$server" || true; }
trap 'kill $server 2>/dev/null || true' EXIT

for round in $(seq "$rounds"); do
  echo "### round $round"
  start_server
  bench --addr "$addr" floor
  bench --addr "$addr" rtt --n 3000
  bench --addr "$addr" rtt --n 3000 --paused 10000
  bench --addr "$addr" throughput --clients 32 --seconds 10
  bench --addr "$addr" chat --clients 32 --seconds 5
  stop_server
  for k in 1000 5000 10000 15000; do
    start_server
    bench --addr "$addr" paused --k "$k" --server-pid "$server"
    stop_server
  done
  # Paused runs kept in SQLite (--store sqlite:): opening, resuming, a flow.
  store=$(mktemp -d)
  start_server target/release/chatgate --bind "$addr" --step-delay 0 --store "sqlite:$store/runs.db"
  bench --addr "$addr" paused --k 10000 --server-pid "$server"
  bench --addr "$addr" rtt --n 1000
  stop_server
  rm -rf "$store"
  # Replicas sharing a Redis of our own (no persistence: the network and
  # the scripts are measured, not the disk): opening 10,000 paused runs, a
  # flow, and replies landing on the replica that does not hold the run.
  if command -v redis-server >/dev/null 2>&1; then
    redis_dir=$(mktemp -d)
    redis_port=18191
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$redis_dir" --daemonize yes --pidfile "$redis_dir/redis.pid" >/dev/null
    sleep 0.5
    redis="redis://127.0.0.1:$redis_port/0"
    bench --store "$redis" paused --k 10000
    bench --store "$redis" rtt --n 1000
    bench --store "$redis" cross --n 1000
    kill "$(cat "$redis_dir/redis.pid")"
    rm -rf "$redis_dir"
  fi
  # A confirmed call of a trivial command tool, without and with the audit
  # log (its fsync per record is the difference).
  start_server target/release/chatgate --bind "$addr" --step-delay 0 --tools bench/tools.toml
  bench --addr "$addr" tool --n 300
  stop_server
  audit=$(mktemp -d)/audit.jsonl
  start_server target/release/chatgate --bind "$addr" --step-delay 0 --tools bench/tools.toml --audit-log "$audit"
  bench --addr "$addr" tool --n 300
  stop_server
  rm -f "$audit"
  # What actix-web alone spends per held stream: the floor under `paused`.
  start_server target/release/actix-floor --bind "$addr"
  bench --addr "$addr" paused --k 10000 --hold-only --server-pid "$server"
  stop_server
done
