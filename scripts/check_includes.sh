#!/usr/bin/env bash
# Checks the layers' include rules (docs/conventions.md, "The layers"): which project headers each folder
# may include. Fails, naming the file, the line and the rule, when for example a CUDA kernel family
# includes another family's headers or a shared header under src/cuda/common includes a family's.
# Run by CTest (test `include_layers`, label cpu) and so by scripts/test.sh and CI.
#
#   scripts/check_includes.sh [repository root, default: this script's]
#
# Only quoted includes of project headers are checked: "sciattn/..." (the public API), "common/...",
# "cpu/...", "cuda/..." (src/). A quoted include without a folder names a file beside the includer;
# one that climbs with "../" is refused everywhere, so that no rule can be walked around.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# The benchmarks time two internal steps of the block-sparse index upload one by one (the tile
# index and the int32 packing); those headers, and only those, are theirs besides the public API.
bench_internals='common/block_sparse_device_pack.h common/sparse_attention_tiles.h'

# allowed <file>: the include prefixes (or whole paths) the file's folder may use.
allowed() {
  case "$1" in
    include/sciattn/*) echo "sciattn/" ;;
    src/common/*) echo "sciattn/ common/" ;;
    src/cpu/*) echo "sciattn/ common/ cpu/" ;;
    src/cuda/common/*) echo "sciattn/ common/ cuda/common/" ;;
    src/cuda/*/*)
      local family=${1#src/cuda/}
      family=${family%%/*}
      echo "sciattn/ common/ cuda/common/ cuda/$family/"
      ;;
    src/cuda/*) echo "sciattn/ common/ cuda/common/" ;;
    src/*) echo "sciattn/ common/ cpu/ cuda/" ;;
    tools/* | bindings/* | examples/*) echo "sciattn/" ;;
    bench/*) echo "sciattn/ $bench_internals" ;;
    *) echo "*" ;;  # tests: anything
  esac
}

# The checked files: git's list in a checkout (no build folders), else every file below the folders.
list_sources() {
  local folders=(include src tools bindings examples bench)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files --cached --others --exclude-standard -- "${folders[@]}"
  else
    find "${folders[@]}" -type f 2>/dev/null
  fi
}

violations=0
while IFS= read -r file; do
  rules=$(allowed "$file")
  [ "$rules" = "*" ] && continue
  while IFS=: read -r line header; do
    [ -n "$line" ] || continue
    ok=0
    if [[ "$header" == *../* ]]; then
      ok=0
    elif [[ "$header" != */* ]]; then
      ok=1  # a file beside the includer
    elif [[ "$header" != sciattn/* && "$header" != common/* && "$header" != cpu/* &&
            "$header" != cuda/* ]]; then
      ok=1  # not a project header (e.g. <nlohmann/json.hpp> written with quotes)
    else
      for rule in $rules; do
        if [[ "$rule" == */ && "$header" == "$rule"* ]] || [[ "$header" == "$rule" ]]; then
          ok=1
          break
        fi
      done
    fi
    if [ "$ok" = 0 ]; then
      echo "$file:$line: includes \"$header\"; files here may include only: $rules"
      violations=$((violations + 1))
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$file" |
           sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(list_sources | grep -E '\.(h|hpp|cuh|cpp|cc|cu|in)$')

if [ "$violations" -gt 0 ]; then
  echo "check_includes: $violations include(s) break the layer rules (kernel families include"
  echo "only src/cuda/common and their own folder; shared device code belongs in src/cuda/common)"
  exit 1
fi
echo "check_includes: every include follows the layer rules"
