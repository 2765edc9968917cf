#!/usr/bin/env bash
# GPU machine: builds the torch adapter and runs its GPU tests and benchmarks (about 6-8 minutes).
#
#   OUT=/some/dir scripts/gpu/torch_adapter.sh
#   (GPUMEM_GPU_BUILD=dir: build directory, default build-gpu; GPUMEM_SKIP_BUILD=1: reuse it as is)
#
# 1. build (gpumem_torch, tests, example, benchmark; viewer off)
# 2. [gpu] tests of the CUDA allocator (record_stream stress, OOM + recovery, empty_cache, snapshots)
#    and the CPU tests
# 3. train_transformer twice with deterministic settings, native then gpumem: losses must be
#    identical; then both again at full speed for step time and peak reserved
# 4. examples/python_swap.py: load_library, LD_PRELOAD, CUDAPluggableAllocator and CPU paths
# 5. bench torch_alloc_pairs (gpumem vs native raw_alloc/raw_delete) and the GPT-2 training run
# $OUT gets two files: summary.txt (verdicts and numbers) and torch_adapter_logs.tar.gz (every log,
# snapshots as pickle + memory_viz html). Exit status: 0 if every check passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
build=${GPUMEM_GPU_BUILD:-$root/build-gpu}
summary=$OUT/summary.txt
LOGS=$OUT/logs
mkdir -p "$LOGS"
finish() {
  tar czf "$OUT/torch_adapter_logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
}
trap finish EXIT
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
step() { echo; echo "=== $* ($(date +%T))"; }

py=${GPUMEM_PYTHON:-python3}
torch_prefix=$("$py" -c 'import torch;print(torch.utils.cmake_prefix_path)')

step "configure + build"
t0=$SECONDS
if [ "${GPUMEM_SKIP_BUILD:-0}" = 1 ]; then  # rerun on an existing build
  true
else {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_PYTHON="$py" -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build "$build" -j "$(nproc)" --target gpumem_torch torch_adapter_parts torch_cpu_training \
    torch_cuda_allocator torch_cuda_sim train_transformer torch_alloc_pairs
} >"$LOGS/build.log" 2>&1
fi
if [ $? -ne 0 ]; then
  tail -40 "$LOGS/build.log"
  note "build: FAILED (see build.log)"
  exit 1
fi
note "build: ok in $((SECONDS - t0)) s"
lib=$(find "$build/torch" -maxdepth 1 -name 'libgpumem_torch.so' | head -1)

step "C++ tests"
for t in torch_cuda_allocator torch_cuda_sim torch_adapter_parts torch_cpu_training; do
  bin=$(find "$build/tests" -name "$t" -type f -perm -u+x | head -1)
  if (cd "$root" && GPUMEM_SOURCE_DIR="$root" GPUMEM_SHARED_DIR="$root/../shared" timeout 300 "$bin" --order lex \
        >"$LOGS/$t.log" 2>&1); then
    note "$t: passed ($(grep -E 'test cases|All tests passed' "$LOGS/$t.log" | tail -1))"
  else
    note "$t: FAILED (see $t.log)"; tail -30 "$LOGS/$t.log"; status=1
  fi
done

step "train_transformer: deterministic losses, native vs gpumem"
tt="$build/examples/train_transformer"
det_args=(--device cuda --steps 12 --batch 8 --min-seq 32 --max-seq 256 --deterministic --seed 3)
"$tt" --allocator native "${det_args[@]}" >"$LOGS/train_det_native.log" 2>&1
"$tt" --allocator gpumem "${det_args[@]}" >"$LOGS/train_det_gpumem.log" 2>&1
if diff <(grep -oE 'loss [^ ]+' "$LOGS/train_det_native.log") <(grep -oE 'loss [^ ]+' "$LOGS/train_det_gpumem.log") \
     >"$LOGS/train_det_diff.log" && [ "$(grep -c '^step' "$LOGS/train_det_gpumem.log")" -eq 12 ]; then
  note "train_transformer deterministic: 12 losses identical (native vs gpumem)"
else
  note "train_transformer deterministic: losses DIFFER or run failed (see train_det_*.log)"; status=1
fi

step "train_transformer: step time and peaks"
run_args=(--device cuda --steps 40 --batch 16 --min-seq 64 --max-seq 1024 --d-model 512 --layers 6 --heads 8)
"$tt" --allocator native "${run_args[@]}" >"$LOGS/train_native.log" 2>&1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$tt" --allocator native "${run_args[@]}" \
  >"$LOGS/train_expandable.log" 2>&1
"$tt" --allocator gpumem "${run_args[@]}" >"$LOGS/train_gpumem.log" 2>&1
for m in native expandable gpumem; do
  note "train_transformer $m: $(grep '^summary' "$LOGS/train_$m.log" || echo 'FAILED')"
  grep -q '^summary' "$LOGS/train_$m.log" || status=1
done

step "python_swap.py: all install paths"
if PYTHONUNBUFFERED=1 timeout 300 "$py" examples/python_swap.py --lib "$lib" --mode all --out "$LOGS" \
     >"$LOGS/python_swap.log" 2>&1; then
  note "python_swap: $(tail -1 "$LOGS/python_swap.log")"
else
  note "python_swap: FAILED ($(grep -E '^FAIL|python_swap:' "$LOGS/python_swap.log" | tr '\n' ' '))"; status=1
fi

step "bench torch_alloc_pairs"
if timeout 240 "$build/bench/torch_alloc_pairs" >"$LOGS/torch_alloc_pairs.log" 2>&1; then
  cat "$LOGS/torch_alloc_pairs.log" | tee -a "$summary"
else
  note "torch_alloc_pairs: FAILED"; tail -20 "$LOGS/torch_alloc_pairs.log"; status=1
fi

step "bench gpt2_train"
if PYTHONUNBUFFERED=1 timeout 300 "$py" bench/gpt2_train.py --lib "$lib" --steps 30 --out "$LOGS" \
     >"$LOGS/gpt2_train.log" 2>&1; then
  sed -n '/^GPT-2/,$p' "$LOGS/gpt2_train.log" | tee -a "$summary"
else
  note "gpt2_train: FAILED"; tail -30 "$LOGS/gpt2_train.log"; status=1
fi

echo
cat "$summary"
exit $status
