#!/usr/bin/env bash
# Issue 13's four-thread rows with arenas (arenas:N; docs/notes/thread-caches.md, "Arenas") beside
# the default, in one run on the GPU host: the engine alone (alloc_pairs_ab.sh: the staged
# bench_alloc_pairs as A, the same binary with --config arenas:N as B, alternated), then through
# libtorch (torch_pairs_reps.sh: REPS processes with the default, then REPS with arenas:N).
#
#   OUT=/dir scripts/gpu/arenas_ab.sh [N] [REPS]
#     N      arenas (default 4)
#     REPS   alternations of the engine runs and processes of each libtorch kind (default 3)
# $OUT gets engine/ (alloc_pairs_ab.sh's files), torch-default/ and torch-arenas/
# (torch_pairs_reps.sh's). Binaries from scripts/gpu/stage.sh; nothing is compiled here.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
: "${OUT:?set OUT}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
n=${1:-4}
reps=${2:-3}
case "$n" in '' | *[!0-9]*) echo "arenas_ab: N must be a whole number from 2 to 64, not '$n'" >&2; exit 2 ;; esac
case "$reps" in '' | *[!0-9]* | 0) echo "arenas_ab: REPS must be a positive whole number, not '$reps'" >&2; exit 2 ;; esac
if [ "$n" -lt 2 ] || [ "$n" -gt 64 ]; then
  echo "arenas_ab: N must be a whole number from 2 to 64, not '$n'" >&2
  exit 2
fi
bench="$BUILD/bench/bench_alloc_pairs"
[ -x "$bench" ] || { echo "arenas_ab: $bench is missing; stage it with scripts/gpu/stage.sh" >&2; exit 1; }

# B: the same binary with the arenas (a wrapper, as for --engine-per-thread).
wrapper="$OUT/bench_alloc_pairs_arenas"
mkdir -p "$OUT/engine" "$OUT/torch-default" "$OUT/torch-arenas"
printf '#!/bin/sh\nexec %s --config arenas:%s "$@"\n' "$bench" "$n" >"$wrapper"
chmod +x "$wrapper"
echo "== engine alone: A = default, B = arenas:$n"
OUT="$OUT/engine" "$here/alloc_pairs_ab.sh" "$bench" "$wrapper" "$reps"
rm -f "$wrapper"
args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
echo "== through libtorch, default"
OUT="$OUT/torch-default" "$here/torch_pairs_reps.sh" "$reps" -- "${args[@]}"
echo "== through libtorch, arenas:$n"
OUT="$OUT/torch-arenas" "$here/torch_pairs_reps.sh" "$reps" -- "${args[@]}" --config "arenas:$n"
