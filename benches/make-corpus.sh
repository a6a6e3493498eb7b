#!/usr/bin/env bash
# Builds the benchmark corpus from the Markdown files of the crates in the local cargo
# registry (READMEs, changelogs, docs): real-world Markdown of every shape, never
# committed. Writes target/bench-corpus/{files/,manifest.tsv}.
#
# Usage: benches/make-corpus.sh [MAX_FILES]   (default 3000)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-3000}
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
out=target/bench-corpus
rm -rf "$out"
mkdir -p "$out/files"
if [ ! -d "$registry" ]; then
  echo "no cargo registry at $registry: run 'cargo fetch' first" >&2
  exit 1
fi
printf 'id\tpath\tfile\n' > "$out/manifest.tsv"
n=0
# Sorted for a stable corpus across runs on the same registry; files over 1 MiB skipped.
while IFS= read -r f; do
  n=$((n + 1))
  cp "$f" "$out/files/$n.md"
  printf '%s\tcorpus/%s.md\tfiles/%s.md\n' "$n" "$n" "$n" >> "$out/manifest.tsv"
  [ "$n" -ge "$max" ] && break
done < <(find "$registry" -type f \( -iname '*.md' -o -iname '*.markdown' \) -size -1024k | LC_ALL=C sort)
bytes=$(du -sb "$out/files" | cut -f1)
echo "corpus: $n files, $bytes bytes in $out"
