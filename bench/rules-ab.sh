#!/usr/bin/env bash
# A/B of the rules' cost, and allowed vs asked, on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p chatgate -p chatgate-bench --bins
addr=127.0.0.1:18291
bench=target/release/chatgate-bench
run() {
  target/release/chatgate --bind "$addr" --step-delay 0 --tools "$1" >/dev/null 2>&1 &
  server=$!
  for _ in $(seq 100); do curl -fs "http://$addr/healthz" >/dev/null 2>&1 && break; sleep 0.05; done
  shift
  "$bench" --addr "$addr" "$@"
  kill -TERM $server; wait $server || true
}
for round in 1 2 3; do
  echo "## round $round"
  echo "# no rules"; run bench/tools.toml allowed --n 1000 --asked-only; run bench/tools.toml tool --n 500
  echo "# 256 rules"; run bench/rules.toml allowed --n 1000 --asked-only; run bench/rules.toml tool --n 500
  echo "# allowed vs asked"; run bench/rules.toml allowed --n 1000
done
