#!/usr/bin/env bash
# The parity suite: builds the sidecar (debug) and runs it against the gateway stand-in.
# Knobs: PARITY_SEED, PARITY_CASES, PARITY_ONLY, PARITY_VERBOSE (see README.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

lock=tests/parity/package-lock.json
stamp=tests/parity/node_modules/.parity-lock.sha256
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --prefix tests/parity --no-audit --no-fund
  printf '%s\n' "$want" > "$stamp"
fi

cargo build --locked
node tests/parity/run.mjs target/debug/knowtation-sidecar
