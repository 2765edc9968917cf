#!/usr/bin/env bash
# Issue 13's rows through libtorch, as the project measures speed: torch_alloc_pairs run REPS times,
# each a fresh process (PyTorch's allocator and gpumem's alternate round by round inside it), every
# process pinned to the same cores, then torch_pairs_summary.py: per pattern the median over the
# processes of each one's speed-up, with the smallest and largest, and the targets read from the
# medians (>= 3x native with 1 and T threads, under 1 us per pair per thread with T). speed.sh runs
# torch_alloc_pairs once; one process's ratio moves with the host by tens of percent.
#
#   OUT=/dir scripts/gpu/torch_pairs_reps.sh [REPS] [-- ARGS...]
#     REPS   processes (default 5)
#     ARGS   passed to every run (default: --ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
#   TORCH_PAIRS_CPUS        cores every process is pinned to, taskset -c syntax (default 2-5: four
#                           cores for the 4-thread rounds; empty: not pinned)
#   TORCH_PAIRS_DEADLINE_S  no run starts after this many seconds (default 150); each run is cut
#                           after TORCH_PAIRS_RUN_TIMEOUT_S (default 60) and says so
# $OUT gets run-N.log per process, torch-pairs-summary.txt and torch-pairs-summary.json.
# Binaries from scripts/gpu/stage.sh (BUILD/bench/torch_alloc_pairs); nothing is compiled here.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
: "${OUT:?set OUT}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  echo "usage: OUT=/dir $0 [REPS] [-- TORCH_ALLOC_PAIRS_ARGS...]" >&2
  exit 2
}
reps=5
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  reps=$1
  shift
fi
if [ $# -gt 0 ]; then
  [ "$1" = "--" ] || usage
  shift
fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
case $reps in '' | *[!0-9]* | 0) echo "torch_pairs_reps: REPS must be a positive integer, got '$reps'" >&2; exit 2 ;; esac
for x in "${args[@]}"; do
  if [ "$x" = "--sim" ]; then
    echo "torch_pairs_reps: --sim has no native column to compare with; run it on a GPU without --sim" >&2
    exit 2
  fi
done
bin=$BUILD/bench/torch_alloc_pairs
if [ ! -x "$bin" ]; then
  echo "torch_pairs_reps: $bin is not there; build bench/torch_alloc_pairs (GPUMEM_WITH_TORCH=ON) and stage it with scripts/gpu/stage.sh" >&2
  exit 2
fi
cpus=${TORCH_PAIRS_CPUS-2-5}
pin=()
if [ -n "$cpus" ]; then
  if ! command -v taskset >/dev/null; then
    echo "torch_pairs_reps: taskset (util-linux) is needed to pin the runs; install it or set TORCH_PAIRS_CPUS= to run unpinned" >&2
    exit 2
  fi
  if ! taskset -c "$cpus" true 2>/dev/null; then
    echo "torch_pairs_reps: cannot pin to cores '$cpus' (taskset -c $cpus failed; this machine has $(nproc) cores); set TORCH_PAIRS_CPUS" >&2
    exit 2
  fi
  pin=(taskset -c "$cpus")
fi
deadline=${TORCH_PAIRS_DEADLINE_S:-150}
run_timeout=${TORCH_PAIRS_RUN_TIMEOUT_S:-60}
mkdir -p "$OUT"
start=$SECONDS
status=0
logs=()
echo "torch_pairs_reps: $reps processes of $bin ${args[*]}; cores: ${cpus:-not pinned}"
for ((rep = 1; rep <= reps; rep++)); do
  if ((SECONDS - start > deadline)); then
    echo "torch_pairs_reps: deadline ${deadline}s reached before run $rep; stopping"
    status=1
    break
  fi
  log=$OUT/run-$rep.log
  echo "== run $rep ($((SECONDS - start)) s)"
  timeout --kill-after=5 "$run_timeout" "${pin[@]}" "$bin" "${args[@]}" >"$log" 2>&1
  rc=$?
  cat "$log"
  if [ $rc -ne 0 ]; then
    echo "torch_pairs_reps: run $rep exited $rc (124: cut after ${run_timeout}s); left out of the summary"
    status=1
    continue
  fi
  logs+=("$log")
done
if [ ${#logs[@]} -eq 0 ]; then
  echo "torch_pairs_reps: no run finished; nothing to summarize" >&2
  exit 1
fi
"$PY" "$here/torch_pairs_summary.py" "${logs[@]}" --json "$OUT/torch-pairs-summary.json" | tee "$OUT/torch-pairs-summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "cores: ${cpus:-not pinned}; total $((SECONDS - start)) s"
exit $status
