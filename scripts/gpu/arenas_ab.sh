#!/usr/bin/env bash
# Issue 13's four-thread rows with arenas (arenas:N; docs/notes/thread-caches.md, "Arenas") beside
# one engine (arenas:1; the default is arenas:auto, which allows 4), in one run on the GPU host: the
# engine alone (alloc_pairs_ab.sh: the staged bench_alloc_pairs with --config arenas:1 as A, with
# --config arenas:N as B, alternated), then through libtorch (torch_pairs_reps.sh: REPS processes
# with arenas:1, then REPS with arenas:N).
#
#   OUT=/dir scripts/gpu/arenas_ab.sh [N] [REPS]
#     N      arenas (default 4)
#     REPS   alternations of the engine runs and processes of each libtorch kind (default 3)
# $OUT gets engine/ (alloc_pairs_ab.sh's files), torch-one/ and torch-arenas/
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

# A and B: the same binary with one engine and with the arenas (wrappers, as for
# --engine-per-thread).
one="$OUT/bench_alloc_pairs_one"
wrapper="$OUT/bench_alloc_pairs_arenas"
mkdir -p "$OUT/engine" "$OUT/torch-one" "$OUT/torch-arenas"
printf '#!/bin/sh\nexec %s --config arenas:1 "$@"\n' "$bench" >"$one"
printf '#!/bin/sh\nexec %s --config arenas:%s "$@"\n' "$bench" "$n" >"$wrapper"
chmod +x "$one" "$wrapper"
echo "== engine alone: A = arenas:1, B = arenas:$n"
OUT="$OUT/engine" "$here/alloc_pairs_ab.sh" "$one" "$wrapper" "$reps"
rm -f "$one" "$wrapper"
args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
echo "== through libtorch, arenas:1"
OUT="$OUT/torch-one" "$here/torch_pairs_reps.sh" "$reps" -- "${args[@]}" --config arenas:1
echo "== through libtorch, arenas:$n"
OUT="$OUT/torch-arenas" "$here/torch_pairs_reps.sh" "$reps" -- "${args[@]}" --config "arenas:$n"
