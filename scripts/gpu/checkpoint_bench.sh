#!/usr/bin/env bash
# Issue 7 benchmark on the GPU machine: gpumem activation checkpointing on a Llama-style model
# (hidden 2048, intermediate 5504, 12 layers, 16 heads, vocab 32000, batch 4, seq 2048, AdamW,
# bf16 autocast) with no checkpointing, every layer, sqrt(n) segments and the planner at budgets
# cutting activation memory by 50% and more. Prints peak allocated, peak reserved and step time
# per mode, predicted next to measured, and a summary against "none", once per memory probe.
# The planner's budget is model state + FRACTION x (measured peak of "none" - model state), i.e.
# an activation cut of 1 - FRACTION against the measured "none"; it runs plain and with
# --selective (norms and SwiGLU activations recomputed inside every block as well).
# Probes:
#   gpumem-cuda  gpumem installed as libtorch's CUDA allocator, its own statistics
#   cuda-native  PyTorch's native CUDA caching allocator, its getDeviceStats
# Also builds and runs the checkpointing tests (the [gpu] one included).
#
#   OUT=/path/to/results scripts/gpu/checkpoint_bench.sh
#
# Environment: OUT (required), BUILD (build dir, default build-gpu), PROBES (default
# "gpumem-cuda cuda-native"), FRACTIONS (planner activation budgets as fractions of "none",
# default "0.5"), STEPS (measured steps per mode, default 10), GPUMEM_ALLOC_CONF (gpumem's
# configuration for the gpumem-cuda runs), GPUMEM_SKIP_BUILD=1 (reuse an existing build),
# CKPT_BENCH_CONFIG (replaces the model and device arguments: a CPU dry run can pass
# "--device cpu --hidden 128 --intermediate 344 --layers 6 --heads 4 --vocab 512 --batch 2
# --seq 64 --steps 2 --warmup 1" with PROBES=gpumem-cpu). Runs from the repo root; about 5-7
# minutes, the build included.
set -euo pipefail
: "${OUT:?set OUT to the directory for results}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-$root/build-gpu}
probes=${PROBES:-gpumem-cuda cuda-native}
fractions=${FRACTIONS:-0.5}
steps=${STEPS:-10}
mkdir -p "$OUT"

if [ "${GPUMEM_SKIP_BUILD:-0}" != 1 ]; then
  prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  echo "[checkpoint_bench] configuring $build" >&2
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WITH_BENCH=OFF >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log" >&2; exit 1; }
  echo "[checkpoint_bench] building" >&2
  cmake --build "$build" -j "$(nproc)" --target checkpoint_llama ckpt_planner_test \
    ckpt_checkpoint_test ckpt_planned_memory_test >"$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log" >&2; exit 1; }
fi

echo "[checkpoint_bench] tests" >&2
for t in ckpt_planner_test ckpt_checkpoint_test ckpt_planned_memory_test; do
  if "$build/tests/checkpointing/$t" >"$OUT/$t.log" 2>&1; then echo "$t: passed"
  else echo "$t: FAILED (see $t.log)"; fi
done | tee "$OUT/tests.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1 || true

if [ -n "${CKPT_BENCH_CONFIG:-}" ]; then
  read -r -a cfg <<<"$CKPT_BENCH_CONFIG"
else
  cfg=(--device cuda --hidden 2048 --intermediate 5504 --layers 12 --heads 16 --vocab 32000
       --batch 4 --seq 2048 --steps "$steps" --warmup 3)
fi
# Most telling runs first, and the summary rewritten after every run, so that a run cut short by
# a time limit still leaves its results.
names="none $(for f in $fractions; do printf 'planner-selective-%s planner-%s ' "$f" "$f"; done)every sqrt"
field() {  # field NAME LOGFILE: a key of the log's RESULT line
  { grep -h '^RESULT' "$2" 2>/dev/null || true; } | tail -1 | tr ' ' '\n' | sed -n "s/^$1=//p"
}

# Summary: activation = peak allocated - model state (weights, grads, AdamW moments); cut and
# +time are against "none" measured with the same probe.
summarize() {
  local probe name
  for probe in $probes; do
    echo "== probe $probe"
    printf '%-22s %9s %9s %9s %9s %8s %9s %8s %9s  %s\n' mode peak_GB pred_GB reserv_GB act_GB \
      act_cut step_ms +time pred_ms plan
    for name in $names; do
      [ -f "$OUT/$probe-$name.log" ] || continue
      { grep -h '^RESULT' "$OUT/$probe-$name.log" || echo "RESULT failed=1"; } | tail -1 |
        sed "s/^RESULT /RESULT name=$name /"
    done |
    awk '
      function field(k,   i, kv) { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
      {
        name = field("name"); if (field("failed") == 1) { printf "%-22s failed\n", name; next }
        peak = field("peak_allocated_bytes"); pred = field("predicted_peak_bytes")
        res = field("peak_reserved_bytes"); state = field("model_state_bytes")
        ms = field("step_ms"); pms = field("predicted_step_ms")
        split($0, q, "plan=\""); plan = q[2]; sub(/"$/, "", plan)
        act = peak - state
        if (name == "none") { act0 = act; ms0 = ms }
        cut = act0 > 0 ? 100 * (1 - act / act0) : 0; dt = ms0 > 0 ? 100 * (ms / ms0 - 1) : 0
        printf "%-22s %9.2f %9.2f %9.2f %9.2f %7.1f%% %9.1f %7.1f%% %9.1f  %s\n", name, \
          peak / 1e9, pred / 1e9, res / 1e9, act / 1e9, cut, ms, dt, pms, plan
      }'
  done >"$OUT/summary.txt"
}

for probe in $probes; do
  for name in $names; do
    case $name in
      none) args=(--mode none --verbose) ;;
      every|sqrt) args=(--mode "$name") ;;
      planner-*)
        f=${name##*-}
        peak=$(field peak_allocated_bytes "$OUT/$probe-none.log")
        state=$(field model_state_bytes "$OUT/$probe-none.log")
        if [ -z "$peak" ] || [ -z "$state" ]; then
          echo "RESULT mode=$name failed=1" >"$OUT/$probe-$name.log"; summarize; continue
        fi
        budget=$(awk -v p="$peak" -v s="$state" -v f="$f" 'BEGIN { printf "%d", s + f * (p - s) }')
        args=(--mode planner --budget "$budget")
        case $name in planner-selective-*) args+=(--selective) ;; esac ;;
    esac
    log="$OUT/$probe-$name.log"
    echo "[checkpoint_bench] $probe $name" >&2
    "$build/examples/checkpoint_llama" "${cfg[@]}" --probe "$probe" "${args[@]}" >"$log" 2>&1 \
      || echo "RESULT mode=$name failed=1" >>"$log"
    cat "$log"
    summarize
  done
done
cat "$OUT/summary.txt"
