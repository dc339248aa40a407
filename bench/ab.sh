#!/usr/bin/env bash
# A/B of two chatgate builds on this machine: the scenarios that guard the
# targets, alternating OLD and NEW ROUNDS times (default 3) so that drift in
# the machine's speed hits both alike. Prints each run's summary lines.
# Usage: bench/ab.sh OLD_BIN NEW_BIN [ROUNDS]   (a redis-server on PATH adds `cross`)
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 rounds=${3:-3}
ulimit -n 20000
cargo build --release -q -p chatgate-bench --bins
bench=target/release/chatgate-bench
redis_dir=
if command -v redis-server >/dev/null 2>&1; then
  redis_dir=$(mktemp -d)
  redis-server --port 18193 --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$redis_dir" --daemonize yes --pidfile "$redis_dir/redis.pid" >/dev/null
  trap 'kill "$(cat "$redis_dir/redis.pid")" 2>/dev/null; rm -rf "$redis_dir"' EXIT
  sleep 0.5
fi
for round in $(seq "$rounds"); do
  for side in old new; do
    bin=${!side}
    echo "### round $round: $side ($bin)"
    "$bench" --store memory --server-bin "$bin" rtt --n 3000
    "$bench" --store memory --server-bin "$bin" paused --k 10000
    "$bench" --store memory --server-bin "$bin" throughput --clients 32 --seconds 5
    if [ -n "$redis_dir" ]; then
      "$bench" --store redis://127.0.0.1:18193/0 --server-bin "$bin" cross --n 1000
    fi
  done
done
