#!/usr/bin/env bash
# GPU checks of CUDA graphs and memory pools under gpumem (issue 16), with binaries staged by
# scripts/gpu/stage.sh (nothing compiles here; torch.compile's Triton kernels are compiled by the
# machine's gcc, as for any torch.compile user). About 100 s on the H200; budget 130 s.
#
#   OUT=/dir scripts/gpu/graphs.sh             ($OUT gets graphs-summary.txt and graphs-logs.tar.gz)
#   OUT=/dir scripts/gpu/graphs.sh --dry-run   (the CPU machine: BUILD=build, the Python checks on the
#                                               CPU, the C++ tests on the simulated device;
#                                               GRAPHS_PARTS=capture,mempool skips the slow CPU compile)
#
# 1. torch_graph_pools and test_engine_capture: the pools' semantics on the simulated device (C++).
# 2. scripts/gpu/graphs/graphs_check.py under gpumem, then under the native allocator (one process
#    each): capture + replay, a shared pool, make_graphed_callables, MemPool round trip, memory
#    returned after the graphs and pools are deleted, torch.compile(mode="reduce-overhead")
#    training with an eval in the middle (cudagraph trees' checkpoint restore), peak reserved.
# 3. graphs_check.py compare: native vs gpumem, the table printed last.
# Needs in BUILD: torch/libgpumem_torch.so, tests/torch/torch_graph_pools,
# tests/allocator/test_engine_capture; cli/gpumem (optional: the per-pool report of the snapshots).
set -uo pipefail
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $dry = 1 ]; then
  export BUILD=${BUILD:-$(cd "$here/../.." && pwd)/build}
  export PY=${PY:-$HOME/.cache/gpumem/venv/bin/python}
fi
source "$here/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
logs=$OUT/graphs-logs
mkdir -p "$logs"
summary=$OUT/graphs-summary.txt
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
trap 'tar czf "$OUT/graphs-logs.tar.gz" -C "$OUT" graphs-logs && rm -rf "$logs"' EXIT
t_all=$SECONDS

if [ $dry = 1 ]; then
  note "graphs: DRY RUN on the CPU machine (BUILD=$BUILD; Python checks on the CPU)"
  device=cpu; steps=4
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$summary"
  device=cuda; steps=8
fi

run_catch() {  # name binary [args...]
  local name=$1 bin=$2; shift 2
  if [ ! -x "$bin" ]; then note "$name: MISSING ($bin)"; status=1; return; fi
  if timeout 60 "$bin" "$@" >"$logs/$name.log" 2>&1; then
    note "$name: passed ($(grep -E 'All tests passed|test cases' "$logs/$name.log" | tail -1))"
  else
    note "$name: FAILED (exit $?; see $name.log)"; tail -25 "$logs/$name.log"; status=1
  fi
}
run_catch torch_graph_pools "$BUILD/tests/torch/torch_graph_pools" --order lex
run_catch test_engine_capture "$BUILD/tests/allocator/test_engine_capture" --order lex

lib=$BUILD/torch/libgpumem_torch.so
parts=${GRAPHS_PARTS:-capture,graphed,mempool,compile}  # a subset for a quicker dry run
check=$here/graphs/graphs_check.py
results=$logs/results
mkdir -p "$results"
# One inductor cache for both runs: the second compiles from the first one's cache (gpumem runs
# first, so a run stopped at the budget still has gpumem's numbers).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpumem-graphs-inductor}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
for alloc in gpumem native; do
  t0=$SECONDS
  limit=70; [ $alloc = native ] && limit=40
  args=(run --allocator "$alloc" --out "$results" --device "$device" --steps "$steps" --parts "$parts"
        --snapshot-dir "$results")
  # Both allocators' reduce-overhead numbers come from a warm inductor cache (an unmeasured first
  # pass): the mid-session run compared gpumem's cold compile with native's warm one, and peak
  # *allocated* differed (117.3 vs 79.1 MiB) for the same program, which no allocator causes; a
  # cold compile autotunes kernels at their first call and allocates for it.
  [ $dry = 0 ] && args+=(--compile-warmup)
  [ $alloc = gpumem ] && args+=(--lib "$lib")
  timeout --kill-after=5 "$limit" "$PY" "$check" "${args[@]}" >"$logs/run_$alloc.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "graphs_check $alloc: every check passed in $((SECONDS - t0)) s"
  else
    why="exit $rc"; [ $rc -ge 124 ] && why="STOPPED at ${limit} s (exit $rc)"
    note "graphs_check $alloc: $why in $((SECONDS - t0)) s (see run_$alloc.log)"; tail -30 "$logs/run_$alloc.log"
    status=1
  fi
done

note ""
note "native vs gpumem:"
timeout 30 "$PY" "$check" compare "$results" >"$logs/compare.log" 2>&1 || status=1
cat "$logs/compare.log" | tee -a "$summary"
# gpumem report on the two snapshots taken at the end of the reduce-overhead training: memory per
# pool (logs only).
if [ -x "$BUILD/cli/gpumem" ]; then
  for alloc in gpumem native; do
    [ -f "$results/${alloc}_compile.pickle" ] &&
      timeout 10 "$BUILD/cli/gpumem" report "$results/${alloc}_compile.pickle" >"$logs/report_$alloc.txt" 2>&1
  done
  sed -n '/memory by pool/,/^$/p' "$logs/report_gpumem.txt" 2>/dev/null | sed 's/^/  gpumem snapshot: /' | tee -a "$summary"
fi
note "graphs: $([ $status = 0 ] && echo 'all passed' || echo 'SOME FAILED') in $((SECONDS - t_all)) s"
exit $status
