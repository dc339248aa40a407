#!/usr/bin/env bash
# Installs the real MCP servers the MCP tests start: the reference filesystem
# server (npm) and a venv with the official Python SDK (PyPI). Then:
#   cargo test --test mcp -- --ignored
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error 2>/dev/null || npm install --no-audit --no-fund --loglevel=error
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
