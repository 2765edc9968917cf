#!/usr/bin/env bash
# GPU machine: builds the core (no torch) and runs the MemorySource conformance suite with its
# [gpu] tests (CudaVmmSource, CudaMallocSource, CudaStreamEvents), then the whole suite binary, then
# the CUDA virtual-memory call microbenchmark. Run from the repo root; results go to $OUT:
#   $OUT/conformance.log     Catch2 output of the [gpu] run and of the full binary
#   $OUT/cuda_vmm_calls.log  microseconds per cuMemCreate/Map/SetAccess/Unmap/Release (2 and 20 MiB)
# Exits non-zero if the build, any test or the benchmark fails. Takes ~2 minutes, mostly the build.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=${OUT:?set OUT to the directory for results}
mkdir -p "$out"
build=${GPUMEM_GPU_BUILD:-$root/build-gpu}
log=$out/conformance.log
: >"$log"
say() { printf '[conformance] %s\n' "$*" | tee -a "$log"; }

say "host $(hostname), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"

say "configuring $build (core only: -DGPUMEM_WITH_TORCH=OFF)"
if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_WITH_TORCH=OFF \
     -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WITH_BENCH=ON -DCUDAToolkit_ROOT=/usr/local/cuda >>"$log" 2>&1; then
  say "FAILED: cmake configure (see above)"; exit 1
fi
grep -q 'GPUMEM_HAVE_CUDA' "$build/compile_commands.json" 2>/dev/null \
  || say "WARNING: the CUDA toolkit was not found; the [gpu] tests will not be built"
say "building test_memory_source and cuda_vmm_calls"
if ! cmake --build "$build" --target test_memory_source cuda_vmm_calls -j "$(nproc)" >>"$log" 2>&1; then
  say "FAILED: build (see above)"; exit 1
fi

status=0
say "running the [gpu] conformance tests"
"$build/tests/allocator/test_memory_source" "[gpu]" --durations yes 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { say "FAILED: [gpu] tests exited $rc"; status=1; }

say "running the whole test_memory_source binary (CPU sources and [gpu])"
"$build/tests/allocator/test_memory_source" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { say "FAILED: test_memory_source exited $rc"; status=1; }

say "running bench cuda_vmm_calls"
"$build/bench/cuda_vmm_calls" 2>&1 | tee "$out/cuda_vmm_calls.log" | tee -a "$log"
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || { say "FAILED: cuda_vmm_calls exited $rc"; status=1; }

[ "$status" = 0 ] && say "PASSED" || say "FAILED (see above)"
exit "$status"
