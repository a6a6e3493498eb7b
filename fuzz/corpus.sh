#!/usr/bin/env bash
# The committed fuzz corpora are one archive per target, fuzz/corpus/<target>.tar.gz, so
# that tens of thousands of small inputs do not swamp the repository's tree.
# tests/fuzz_corpus.rs replays the archives directly; the fuzzer works on a folder.
#
#   fuzz/corpus.sh unpack [target...]   archive -> fuzz/corpus/<target>/ (git-ignored)
#   fuzz/corpus.sh pack   [target...]   fuzz/corpus/<target>/ -> archive
#
# With no target, every archive (unpack) or every folder (pack). Packing is
# reproducible: names sorted, times, owners and modes fixed, gzip without a timestamp,
# so an unchanged corpus packs to the same bytes and a refreshed one diffs as one file.
set -euo pipefail
cd "$(dirname "$0")/corpus"

cmd=${1:-}
shift || true
case $cmd in
unpack)
    targets=("$@")
    if [ ${#targets[@]} -eq 0 ]; then
        for a in *.tar.gz; do targets+=("${a%.tar.gz}"); done
    fi
    for t in "${targets[@]}"; do
        mkdir -p "$t"
        tar -xzf "$t.tar.gz" -C "$t"
        echo "$t: $(find "$t" -type f | wc -l) inputs in fuzz/corpus/$t/"
    done
    ;;
pack)
    targets=("$@")
    if [ ${#targets[@]} -eq 0 ]; then
        for d in */; do targets+=("${d%/}"); done
    fi
    for t in "${targets[@]}"; do
        [ -d "$t" ] || { echo "no folder fuzz/corpus/$t" >&2; exit 1; }
        (cd "$t" && find . -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort) |
            tar --create --no-recursion --directory="$t" --files-from=- \
                --format=ustar --owner=0 --group=0 --numeric-owner \
                --mode=0644 --mtime=@0 |
            gzip -n -9 >"$t.tar.gz.new"
        mv "$t.tar.gz.new" "$t.tar.gz"
        echo "$t: $(tar -tzf "$t.tar.gz" | wc -l) inputs in fuzz/corpus/$t.tar.gz"
    done
    ;;
*)
    echo "usage: fuzz/corpus.sh pack|unpack [target...]" >&2
    exit 2
    ;;
esac
