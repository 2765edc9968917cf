#!/usr/bin/env bash
# Issue 13's whole speed table in one run, with binaries from scripts/gpu/stage.sh (nothing is
# compiled here): the engine alone on SimSource (bench_alloc_pairs: 1 thread and 4 threads, fixed
# sizes and windows of 64 / 1024 live allocations; again with the stats observer attached, as the
# torch adapter runs it), then the CUDA allocators through libtorch's c10 calls, PyTorch's native
# one beside gpumem's, 1 thread and 4 threads (torch_alloc_pairs). The engine and torch steps run
# again with thread_cache:False, so the default's choice is measured in every run (Note [Thread
# caches]). Budget: 90 s wall; each step runs under its own timeout and says so when it is cut.
# The torch step is one process: for the rows' verdicts (median of several fresh processes, pinned)
# use scripts/gpu/torch_pairs_reps.sh.
#
#   OUT=/dir scripts/gpu/speed.sh          ($OUT gets speed-summary.txt and speed-logs.tar.gz)
#   SPEED_QUICK=1 OUT=/dir BUILD=build scripts/gpu/speed.sh
#        a short run (fewer pairs, 1 round) to try the script on a machine without a GPU: the
#        torch step then reports that no CUDA device is there.
#   SPEED_ENGINE_ONLY=1 ...   the engine and lock steps only (no torch_alloc_pairs needed; ~45 s)
# Needs in BUILD: bench/bench_alloc_pairs, bench/bench_lock_handoff, bench/torch_alloc_pairs
# (GPUMEM_WITH_TORCH=ON; not with SPEED_ENGINE_ONLY).
# The lock step (bench_lock_handoff) times one acquisition of the engine's spin lock, std::mutex,
# a spin-then-park lock and a ticket lock with 1..4 threads around 8 shared cache lines: what the
# engine lock's kind costs when every thread takes it (large requests).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
logs=$OUT/speed-logs
mkdir -p "$logs"
summary=$OUT/speed-summary.txt
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
trap 'tar czf "$OUT/speed-logs.tar.gz" -C "$OUT" speed-logs && rm -rf "$logs"' EXIT

if [ -n "${SPEED_QUICK:-}" ]; then
  engine_args=(--ops 20000 --threads 4 --rounds 1)
  lock_args=(--ms 20 --threads 4 --rounds 1)
  torch_args=(--ops 20000 --thread-ops 5000 --threads 4 --rounds 1)
  torch_off_args=("${torch_args[@]}")
else
  engine_args=(--ops 150000 --threads 4 --rounds 3)
  lock_args=(--ms 100 --threads 4 --rounds 3)
  torch_args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 5)
  torch_off_args=(--ops 100000 --thread-ops 20000 --threads 4 --rounds 3)
fi

# step NAME SECONDS BINARY [ARGS...]: runs it under timeout, copies its table into the summary.
step() {
  local name=$1 limit=$2 bin=$3; shift 3
  if [ ! -x "$bin" ]; then note "$name: MISSING ($bin; build its target and stage the build)"; status=1; return; fi
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$bin" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  note "--- $name ($(basename "$bin") $*): exit $rc in $((SECONDS - t0)) s"
  if [ $rc -ge 124 ]; then
    note "$name: CUT at its ${limit} s limit; the rows below are the ones it finished"; status=1
  elif [ $rc -ne 0 ]; then
    note "$name: FAILED (exit $rc; see $name.log)"; status=1
  fi
  cat "$logs/$name.log" >>"$summary"
  cat "$logs/$name.log"
}

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } | tee -a "$summary"
note "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
# Engine alone: the issue's first three rows (1 thread fixed / windows; 4 threads windows).
step engine 18 "$BUILD/bench/bench_alloc_pairs" "${engine_args[@]}"
# Without thread caches (every call takes the engine lock): what the leases buy.
step engine_no_thread_cache 15 "$BUILD/bench/bench_alloc_pairs" "${engine_args[@]}" --config thread_cache:False
# The same with the stats observer the torch adapter attaches: what the adapter's engine costs.
step engine_observer 18 "$BUILD/bench/bench_alloc_pairs" "${engine_args[@]}" --observer
# The engine lock's kind against the alternatives, under the contention large requests make.
step lock_handoff 10 "$BUILD/bench/bench_lock_handoff" "${lock_args[@]}"
if [ -z "${SPEED_ENGINE_ONLY:-}" ]; then
  # Through libtorch: native beside gpumem, 1 and 4 threads (the issue's last two rows).
  step torch 30 "$BUILD/bench/torch_alloc_pairs" "${torch_args[@]}"
  step torch_no_thread_cache 16 "$BUILD/bench/torch_alloc_pairs" "${torch_off_args[@]}" --config thread_cache:False
else
  note "torch steps: skipped (SPEED_ENGINE_ONLY)"
fi
note "speed: $([ $status = 0 ] && echo 'all steps ran' || echo 'a step FAILED or was cut (see above)')"
exit $status
