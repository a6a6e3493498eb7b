#!/usr/bin/env bash
# Builds a benchmark corpus from Markdown files found on this machine, never committed.
# By default: the crates in the local cargo registry (READMEs, changelogs, docs), real-world
# Markdown of every shape, written to target/bench-corpus/{files/,manifest.tsv}.
#
# Usage: benches/make-corpus.sh [MAX_FILES] [DIR...]   (default 3000, the cargo registry)
#   CORPUS_OUT=target/bench-corpus-large benches/make-corpus.sh 100000 \
#     ~/.cargo/registry/src /usr/lib/node_modules /usr/share/doc
# builds a larger corpus; node packages' and distribution docs bring many files that open
# with YAML frontmatter, as notes do.
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-3000}
shift || true
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
if [ $# -eq 0 ]; then
  set -- "$registry"
fi
out=${CORPUS_OUT:-target/bench-corpus}
rm -rf "$out"
mkdir -p "$out/files"
for dir in "$@"; do
  if [ ! -d "$dir" ]; then
    if [ "$dir" = "$registry" ]; then
      echo "no cargo registry at $dir: run 'cargo fetch' first" >&2
    else
      echo "no directory $dir" >&2
    fi
    exit 1
  fi
done
printf 'id\tpath\tfile\n' > "$out/manifest.tsv"
n=0
# Sorted for a stable corpus across runs on the same machine; files over 1 MiB skipped.
while IFS= read -r f; do
  n=$((n + 1))
  cp "$f" "$out/files/$n.md"
  printf '%s\tcorpus/%s.md\tfiles/%s.md\n' "$n" "$n" "$n" >> "$out/manifest.tsv"
  [ "$n" -ge "$max" ] && break
done < <(find "$@" -type f \( -iname '*.md' -o -iname '*.markdown' \) -size -1024k | LC_ALL=C sort)
bytes=$(du -sb "$out/files" | cut -f1)
echo "corpus: $n files, $bytes bytes in $out"
