#!/usr/bin/env bash
# Installs the load generator and timer the benchmarks use (wrk, hyperfine) from the
# distribution's packages. Benchmarks are run by hand, never by CI.
set -euo pipefail
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v hyperfine >/dev/null 2>&1 || need+=(hyperfine)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi
wrk --version 2>&1 | head -1 || true
hyperfine --version
