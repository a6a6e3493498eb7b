#!/usr/bin/env bash
# Packs what benches/scaling.py needs into one folder that can be copied to a machine
# with more cores and no package registry: the sidecar's release binary, the bare
# pulldown-cmark pass (the parse floor), nginx, wrk and haproxy with the shared
# libraries they need beyond glibc, and the script itself.
#
#   benches/scaling-bundle.sh OUT_DIR
#   # on the bigger machine (as root: nginx wants its temp folders):
#   mkdir -p /var/lib/nginx/body /var/lib/nginx/proxy
#   BIN_DIR=OUT_DIR/bin SIDECARS=sidecar=OUT_DIR/bin/knowtation-sidecar \
#     PULLDOWN=OUT_DIR/bin/pulldown-bare SCALE=1,2,4,8 python3 OUT_DIR/scaling.py RESULTS_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scaling-bundle.sh OUT_DIR}
mkdir -p "$OUT/bin" "$OUT/lib"
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null || ! command -v haproxy >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light wrk haproxy
fi
cargo build --release --locked -q --bin knowtation-sidecar --example pulldown-bare
target=${CARGO_TARGET_DIR:-target}/release
cp "$target/knowtation-sidecar" "$target/examples/pulldown-bare" "$OUT/bin/"
for tool in nginx wrk haproxy; do
    cp "$(command -v $tool)" "$OUT/bin/"
    ldd "$(command -v $tool)" | awk '/=>/ {print $3}'
done | sort -u | grep -vE 'libc\.so|libm\.so|libpthread|libdl|librt|ld-linux' |
    xargs -r -I{} cp -L {} "$OUT/lib/"
cp benches/scaling.py "$OUT/"
echo "bundle in $OUT ($(du -sh "$OUT" | cut -f1))"
