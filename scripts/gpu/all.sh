#!/usr/bin/env bash
# Every GPU check in one call, sized for a short lease (about 9 minutes): the torch adapter's tests
# and benchmarks, the op-attribution overhead benchmark, and the checkpointing benchmark at one
# planner budget. One build directory serves all three. Results land in $OUT as three archives and
# one summary.
#
#   OUT=/some/dir scripts/gpu/all.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
: "${OUT:?set OUT}"
export GPUMEM_GPU_BUILD=${GPUMEM_GPU_BUILD:-$root/build-gpu}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary=$OUT/summary.txt
: >"$summary"

mkdir -p /tmp/gpumem-adapter
OUT=/tmp/gpumem-adapter timeout 330 scripts/gpu/torch_adapter.sh >/tmp/gpumem-adapter/run.log 2>&1
echo "torch_adapter.sh exit $?" >>"$summary"
cat /tmp/gpumem-adapter/summary.txt >>"$summary" 2>/dev/null
cp /tmp/gpumem-adapter/torch_adapter_logs.tar.gz "$OUT/" 2>/dev/null

echo "--- op attribution overhead" >>"$summary"
if cmake --build "$GPUMEM_GPU_BUILD" -j "$(nproc)" --target bench_op_attribution_overhead >/tmp/attr-build.log 2>&1; then
  timeout 120 "$GPUMEM_GPU_BUILD/bench/bench_op_attribution_overhead" --device cuda --phases 4 --steps-per-phase 15 \
    >>"$summary" 2>&1 || echo "bench_op_attribution_overhead failed" >>"$summary"
else
  tail -20 /tmp/attr-build.log >>"$summary"
fi

mkdir -p /tmp/gpumem-ckpt
OUT=/tmp/gpumem-ckpt BUILD=$GPUMEM_GPU_BUILD STEPS=${STEPS:-5} FRACTIONS=${FRACTIONS:-0.5} timeout 240 \
  scripts/gpu/checkpoint_bench.sh >/tmp/gpumem-ckpt/run.log 2>&1
echo "checkpoint_bench.sh exit $?" >>"$summary"
cat /tmp/gpumem-ckpt/tests.txt /tmp/gpumem-ckpt/summary.txt >>"$summary" 2>/dev/null
tail -5 /tmp/gpumem-ckpt/run.log >>"$summary"
tar czf "$OUT/ckpt_logs.tar.gz" -C /tmp gpumem-ckpt
cat "$summary"
