#!/usr/bin/env bash
# Issue 7 benchmark on the GPU machine: gpumem activation checkpointing on a Llama-style model
# (hidden 2048, intermediate 5504, 12 layers, 16 heads, vocab 32000, batch 4, seq 2048, AdamW,
# bf16 autocast) with no checkpointing, every layer, sqrt(n) segments and the planner at budgets
# cutting activation memory by 50% and more. Prints peak allocated, peak reserved and step time
# per mode, predicted next to measured, and a summary against "none". Also builds and runs the
# checkpointing tests (the [gpu] one included).
#
#   OUT=/path/to/results scripts/gpu/checkpoint_bench.sh
#
# Environment: OUT (required, results go there), BUILD (build dir, default build-gpu),
# PROBE (cuda-native: PyTorch's CUDA allocator stats, or whatever CUDA allocator is installed),
# FRACTIONS (planner activation budgets as fractions of "none", default "0.5 0.4"),
# STEPS (measured steps per mode, default 10).
# Runs from the repo root; about 3-5 minutes (most of it the build).
set -euo pipefail
: "${OUT:?set OUT to the directory for results}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-$root/build-gpu}
probe=${PROBE:-cuda-native}
fractions=${FRACTIONS:-0.5 0.4}
steps=${STEPS:-10}
mkdir -p "$OUT"

prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
echo "[checkpoint_bench] configuring $build" >&2
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WITH_BENCH=OFF >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log" >&2; exit 1; }
echo "[checkpoint_bench] building" >&2
cmake --build "$build" -j "$(nproc)" --target checkpoint_llama ckpt_planner_test \
  ckpt_checkpoint_test ckpt_planned_memory_test >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log" >&2; exit 1; }

echo "[checkpoint_bench] tests" >&2
for t in ckpt_planner_test ckpt_checkpoint_test ckpt_planned_memory_test; do
  "$build/tests/checkpointing/$t" >"$OUT/$t.log" 2>&1 && echo "$t: passed" \
    || echo "$t: FAILED (see $t.log)"
done | tee "$OUT/tests.txt"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1 || true
cfg=(--device cuda --probe "$probe" --hidden 2048 --intermediate 5504 --layers 12 --heads 16
     --vocab 32000 --batch 4 --seq 2048 --steps "$steps" --warmup 3)
run() {  # name, extra args...
  local name=$1; shift
  echo "[checkpoint_bench] mode $name" >&2
  "$build/examples/checkpoint_llama" "${cfg[@]}" "$@" >"$OUT/$name.log" 2>&1 \
    || echo "RESULT mode=$name failed=1" >>"$OUT/$name.log"
  cat "$OUT/$name.log"
}
run none --mode none --verbose
run every --mode every
run sqrt --mode sqrt
for f in $fractions; do run "planner-$f" --mode planner --budget-fraction "$f"; done

# Summary: activation = peak allocated - model state (weights, grads, AdamW moments).
{
  printf '%-14s %10s %10s %10s %10s %9s %9s %9s  %s\n' mode peak_GB pred_GB reserv_GB act_GB \
    act_cut step_ms +time plan
  for name in none every sqrt $(for f in $fractions; do echo "planner-$f"; done); do
    grep -h '^RESULT' "$OUT/$name.log" | sed "s/^RESULT /RESULT name=$name /"
  done |
  awk '
    function field(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
    {
      mode = field("name"); if (field("failed") == 1) { printf "%-14s failed\n", mode; next }
      peak = field("peak_allocated_bytes"); pred = field("predicted_peak_bytes")
      res = field("peak_reserved_bytes"); state = field("model_state_bytes"); ms = field("step_ms")
      n = split($0, q, "plan=\""); plan = q[2]; sub(/"$/, "", plan)
      act = peak - state
      if (mode == "none") { act0 = act; ms0 = ms }
      cut = act0 > 0 ? 100 * (1 - act / act0) : 0; dt = ms0 > 0 ? 100 * (ms / ms0 - 1) : 0
      printf "%-14s %10.2f %10.2f %10.2f %10.2f %8.1f%% %9.1f %8.1f%%  %s\n", mode, peak / 1e9, \
        pred / 1e9, res / 1e9, act / 1e9, cut, ms, dt, plan
    }'
} | tee "$OUT/summary.txt"
