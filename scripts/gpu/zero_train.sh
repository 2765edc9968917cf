#!/usr/bin/env bash
# ZeRO on one GPU (issue 8): builds zero_train and the zero tests, runs the [gpu] trainer test
# (ProcessGroupNCCL, side-stream prefetch) and zero_train at every stage with world size 1,
# launched the way torchrun launches a rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT, so the TCPStore path runs too), with gpumem as the CUDA allocator (its statistics
# measure the model states) and once with libtorch's allocator for comparison. Everything lands
# in $OUT: one log per run, summary.txt with one RESULT line per run. Runtime: ~5 minutes, most
# of it the build.
#
#   OUT=/tmp/zero scripts/gpu/zero_train.sh
set -uo pipefail
: "${OUT:?set OUT to the directory for results}"
mkdir -p "$OUT"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD_DIR:-$root/build-gpu-zero}
python=${PYTHON:-python3}

prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
  echo "torch is not importable with $python" | tee "$OUT/error.txt"; exit 1; }
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
     -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WITH_BENCH=OFF > "$OUT/configure.log" 2>&1; then
  echo "configure failed, see configure.log" | tee "$OUT/error.txt"; tail -30 "$OUT/configure.log"; exit 1
fi
grep -E "gpumem:" "$OUT/configure.log"
if ! cmake --build "$build" -j "$(nproc)" --target zero_train zero_trainer_test zero_gpumem_stats_test \
     > "$OUT/build.log" 2>&1; then
  echo "build failed, see build.log" | tee "$OUT/error.txt"; tail -40 "$OUT/build.log"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

status=0
echo "== [gpu] trainer test"
"$build/tests/checkpointing/zero_trainer_test" "[gpu]" -s > "$OUT/zero_trainer_test_gpu.log" 2>&1 || status=1
grep -E "CUDA stage|passed|failed|FAILED" "$OUT/zero_trainer_test_gpu.log" | tail -8
echo "== CPU trainer tests on this machine too"
OMP_NUM_THREADS=1 "$build/tests/checkpointing/zero_trainer_test" > "$OUT/zero_trainer_test_cpu.log" 2>&1 || status=1
tail -3 "$OUT/zero_trainer_test_cpu.log"
OMP_NUM_THREADS=1 "$build/tests/checkpointing/zero_gpumem_stats_test" > "$OUT/zero_gpumem_stats_test.log" 2>&1 || status=1
tail -3 "$OUT/zero_gpumem_stats_test.log"

export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517}
model=(--layers 12 --width 1024 --heads 16 --seq 512 --batch 16 --vocab 256 --steps 200 --log-every 50
       --lr 6e-4)
run() {
  local name=$1; shift
  echo "== zero_train $name"
  if "$build/examples/zero_train" --device cuda "${model[@]}" "$@" > "$OUT/zero_train_$name.log" 2>&1; then
    grep RESULT "$OUT/zero_train_$name.log" | sed "s/^/$name /" >> "$OUT/summary.txt"
    sed -n '/model states after/,/RESULT/p' "$OUT/zero_train_$name.log"
  else
    status=1; echo "zero_train $name failed:"; tail -20 "$OUT/zero_train_$name.log"
  fi
}
: > "$OUT/summary.txt"
for stage in 0 1 2 3; do run "stage$stage" --stage "$stage"; done
run stage3_keep --stage 3 --no-reshard-after-forward
run stage3_noprefetch --stage 3 --no-prefetch
run stage3_fp32 --stage 3 --dtype fp32
run stage0_native --stage 0 --allocator native
run stage3_native --stage 3 --allocator native
echo "== summary"; cat "$OUT/summary.txt"
exit $status
