#!/usr/bin/env bash
# The OpenAPI document checked against the live server: it validates
# (openapi-spec-validator), and schemathesis, run against a real chatgate on
# loopback, reports no failure. Its checks of how requests are judged
# (positive_data_acceptance, negative_data_rejection) are left out: whether
# the chat endpoint takes a body depends on a header (Last-Event-ID) and on
# the message's prefix (CONFIRM_ACTION), which no JSON Schema of one
# operation can state (docs/protocol.md, "The OpenAPI document").
#
#   CHATGATE_BIN=target/debug/chatgate tests/faces/openapi.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")"
venv=${1:-.venv}
bin=${CHATGATE_BIN:-../../target/debug/chatgate}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" --bind "127.0.0.1:$port" --step-delay 0ms --confirm-timeout 1s >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.1
done
document=$(mktemp)
curl -sf "http://127.0.0.1:$port/openapi.json" -o "$document"
"$venv/bin/openapi-spec-validator" "$document"
rm -f "$document"
timeout 600 "$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  --max-examples 50 --workers 1 --seed 1 \
  --exclude-checks positive_data_acceptance,negative_data_rejection
