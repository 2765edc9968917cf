#!/usr/bin/env bash
# GPU machine: gpumem's pinned host allocator (gpumem::pinned) against PyTorch's. About 3 minutes.
#
#   scripts/stage_jemalloc.sh            # here, first: .deps/jemalloc (the GPU machine has no jemalloc)
#   OUT=/some/dir scripts/gpu/pinned.sh  # there, with .deps/jemalloc carried along
#   (GPUMEM_JEMALLOC_ROOT=dir: another staged jemalloc; GPUMEM_GPU_BUILD=dir: build directory,
#    default build-gpu-pinned; GPUMEM_SKIP_BUILD=1: reuse it as is)
#
# 1. build test_pinned, bench_pinned_cuda, bench_pinned_dataloader, libgpumem_pinned_torch.so and
#    test_pinned_torch (against the machine's torch)
# 2. test_pinned: the CPU tests and the [gpu] ones (cudaHostRegister regions, a block that waits for
#    a real copy); test_pinned_torch: pin_memory, non_blocking copies, host stats through gpumem
# 3. bench_pinned_cuda: host-to-device GB/s from gpumem pinned, cudaHostAlloc and pageable memory;
#    the DataLoader-style workload with real copies (224x224 and multi-scale images)
# 4. the same two workloads through PyTorch's APIs (bench/pinned_torch_dataloader.py): once with
#    PyTorch's own pinned allocator, once with gpumem's installed (libgpumem_pinned_torch.so, under
#    GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384), numbers from torch.cuda.host_memory_stats()
# $OUT gets summary.txt (the table, last) and pinned_logs.tar.gz. Exit status 0 if every step passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu-pinned/out}
build=${GPUMEM_GPU_BUILD:-$root/build-gpu-pinned}
jemalloc=${GPUMEM_JEMALLOC_ROOT:-$root/.deps/jemalloc}
py=${GPUMEM_PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary=$OUT/summary.txt
LOGS=$OUT/logs
mkdir -p "$LOGS"
trap 'tar czf "$OUT/pinned_logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"' EXIT
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
step() { echo; echo "=== $* ($(date +%T))"; }

if [ ! -f "$jemalloc/lib/libjemalloc_pic.a" ] && [ ! -f /usr/include/jemalloc/jemalloc.h ]; then
  note "jemalloc: missing. Run scripts/stage_jemalloc.sh on a machine with libjemalloc-dev and carry .deps/jemalloc"
  exit 1
fi
je_args=()
[ -f "$jemalloc/lib/libjemalloc_pic.a" ] && je_args=(-DGPUMEM_JEMALLOC_ROOT="$jemalloc")

step "configure + build"
t0=$SECONDS
if [ "${GPUMEM_SKIP_BUILD:-0}" != 1 ]; then
  torch_prefix=$("$py" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  if ! { timeout 240 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUMEM_WITH_TORCH=ON \
           -DCMAKE_PREFIX_PATH="$torch_prefix" -DTORCH_CUDA_ARCH_LIST=9.0 -DGPUMEM_WITH_VIEWER=OFF "${je_args[@]}" &&
         timeout 400 cmake --build "$build" -j "$(nproc)" --target test_pinned bench_pinned_cuda \
           bench_pinned_dataloader gpumem_pinned_torch test_pinned_torch
       } >"$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"
    note "build: FAILED (see build.log)"
    exit 1
  fi
fi
note "build: ok in $((SECONDS - t0)) s"

step "test_pinned (CPU and [gpu] tests)"
if timeout 300 "$build/tests/pinned/test_pinned" --order lex >"$LOGS/test_pinned.log" 2>&1; then
  note "test_pinned: passed ($(grep -E 'test cases|All tests passed' "$LOGS/test_pinned.log" | tail -1))"
else
  note "test_pinned: FAILED (see test_pinned.log)"; tail -30 "$LOGS/test_pinned.log"; status=1
fi
if grep -qE "skipped|no CUDA device" "$LOGS/test_pinned.log"; then
  note "test_pinned: [gpu] tests SKIPPED: no device seen"; status=1
fi
if timeout 200 "$build/tests/pinned/test_pinned_torch" --order lex >"$LOGS/test_pinned_torch.log" 2>&1 &&
   ! grep -q "no CUDA device" "$LOGS/test_pinned_torch.log"; then
  note "test_pinned_torch: passed ($(grep -E 'test cases|All tests passed' "$LOGS/test_pinned_torch.log" | tail -1))"
else
  note "test_pinned_torch: FAILED or skipped (see test_pinned_torch.log)"; tail -30 "$LOGS/test_pinned_torch.log"; status=1
fi
lib="$build/pinned/torch/libgpumem_pinned_torch.so"

for scale in 0 1; do
  name=$([ $scale = 1 ] && echo multiscale || echo fixed)
  step "bench_pinned_cuda ($name)"
  if ! timeout 180 "$build/bench/bench_pinned_cuda" --steps 600 --multi-scale $scale >"$LOGS/gpumem_$name.log" 2>&1; then
    note "bench_pinned_cuda $name: FAILED (see gpumem_$name.log)"; tail -20 "$LOGS/gpumem_$name.log"; status=1
  fi
  cat "$LOGS/gpumem_$name.log"
  "$build/bench/bench_pinned_dataloader" --steps 600 --multi-scale $scale --dump "$LOGS/$name.txt"
done

step "the workloads through PyTorch's APIs: PyTorch's pinned allocator"
if ! timeout 240 "$py" bench/pinned_torch_dataloader.py "$LOGS/fixed.txt" "$LOGS/multiscale.txt" \
     >"$LOGS/torch.log" 2>&1; then
  note "pinned_torch_dataloader (torch): FAILED (see torch.log)"; tail -20 "$LOGS/torch.log"; status=1
fi
cat "$LOGS/torch.log"
step "the workloads through PyTorch's APIs: gpumem's pinned allocator installed"
if ! GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 timeout 240 "$py" bench/pinned_torch_dataloader.py \
     "$LOGS/fixed.txt" "$LOGS/multiscale.txt" --gpumem "$lib" >"$LOGS/torch_gpumem.log" 2>&1; then
  note "pinned_torch_dataloader (gpumem): FAILED (see torch_gpumem.log)"; tail -20 "$LOGS/torch_gpumem.log"; status=1
fi
cat "$LOGS/torch_gpumem.log"

result() {  # result FILE KEY: the value of KEY= on the file's RESULT line, "-" if none
  local v
  v=$(grep -h '^RESULT' "$1" 2>/dev/null | grep -oE "$2=[^ ]+" | head -1 | cut -d= -f2)
  echo "${v:--}"
}
gbps() {  # gbps FILE BYTES COLUMN: a column of the bandwidth table, "-" if none
  local v
  v=$(awk -v b="$2" -v c="$3" '$1 == b { print $c; exit }' "$1" 2>/dev/null)
  echo "${v:--}"
}
{
  echo
  echo "pinned host memory, DataLoader-style workload, 600 steps: peak locked / peak requested (target <= 1.1)"
  printf '%-12s %14s %18s %16s\n' workload gpumem_c++ gpumem_via_torch pytorch
  for name in fixed multiscale; do
    printf '%-12s %14s %18s %16s\n' "$name" "$(result "$LOGS/gpumem_$name.log" gpumem_locked_over_requested)" \
      "$(result "$LOGS/torch_gpumem.log" "gpumem_${name}_locked_over_requested")" \
      "$(result "$LOGS/torch.log" "torch_${name}_locked_over_requested")"
  done
  echo
  echo "host-to-device GB/s (target: gpumem pinned = PyTorch pinned)"
  printf '%-10s %14s %14s %14s %16s %10s\n' bytes gpumem_c++ cudaHostAlloc torch_pinned gpumem_via_torch pageable
  for mb in 16 64 256; do
    b=$((mb << 20))
    printf '%-10s %14s %14s %14s %16s %10s\n' "$b" "$(gbps "$LOGS/gpumem_fixed.log" $b 2)" \
      "$(gbps "$LOGS/gpumem_fixed.log" $b 3)" "$(gbps "$LOGS/torch.log" $b 2)" "$(gbps "$LOGS/torch_gpumem.log" $b 2)" \
      "$(gbps "$LOGS/gpumem_fixed.log" $b 4)"
  done
} | tee -a "$summary"
exit $status
