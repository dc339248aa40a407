#!/usr/bin/env bash
# Starts chatgate on a free loopback port, makes a few runs (so every metric
# family has samples), and runs `promtool check metrics` on both expositions
# /metrics offers: Prometheus text (the default) and OpenMetrics.
set -euo pipefail
bin=${CHATGATE_BIN:-target/debug/chatgate}
log=$(mktemp)
"$bin" --bind 127.0.0.1:0 --step-delay 0 --confirm-timeout 1s >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log" | head -n1)
  [ -n "$url" ] && break
  sleep 0.05
done
[ -n "$url" ] || { echo "chatgate did not start"; cat "$log"; exit 1; }
post() { curl -s -N -H 'Content-Type: application/json' -d "$1" "$url/api/v1/chat/stream" >/dev/null; }
post '{"message":"what is this?","session_id":"m1"}'
post '{"message":"CONFIRM_ACTION:confirm","session_id":"nobody"}' || true
post '{"message":"one step","session_id":"m2"}' &   # times out after 1 s
sleep 0.3
post '{"message":"CONFIRM_ACTION:cancel","session_id":"m2"}'
wait %2 2>/dev/null || true

# Shown on stderr as it goes by (not `tee /dev/stderr`: that truncates a
# log file stderr is redirected to).
curl -s "$url/metrics" | tee >(cat >&2) | promtool check metrics
curl -s -H 'Accept: application/openmetrics-text; version=1.0.0' "$url/metrics" \
  | grep -q '^# EOF$'
curl -s -D - -o /dev/null "$url/metrics" | grep -qi '^content-type: text/plain; version=0.0.4'
echo "promtool: metrics OK"
