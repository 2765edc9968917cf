#!/usr/bin/env bash
# GPU machine: gpumem's pinned host allocator (issue 17) against PyTorch's, with binaries staged by
# scripts/gpu/stage.sh (nothing is compiled here). About 45 s; run_all.sh gives it 85 s.
#
#   OUT=/dir scripts/gpu/pinned.sh     ($OUT gets pinned-summary.txt, pinned-logs.tar.gz)
#
# Needs in BUILD (a full build of scripts/setup.sh, staged): tests/pinned/test_pinned,
# tests/pinned/test_pinned_torch, bench/bench_pinned_cuda, bench/bench_pinned_dataloader,
# torch/libgpumem_torch.so, torch/libgpumem_pinned_torch.so, cli/gpumem (optional). jemalloc is
# linked statically into the pinned binaries (renamed gpumem_je_*): nothing else to carry.
#
# 1. test_pinned (all but the [symbols] cases, which look for the build machine's files): the CPU
#    cases and the [gpu] ones (cudaHostRegister regions, a block that waits for a real copy, markers
#    per device); test_pinned_torch: pin_memory, non_blocking copies, host stats through gpumem (C++)
# 2. bench_pinned_cuda: host-to-device GB/s from gpumem pinned, cudaHostAlloc and pageable memory;
#    the DataLoader-style workload with real copies (224x224 and multi-scale images)
# 3. bench/pinned_torch_dataloader.py: the same workloads and bandwidths through PyTorch's APIs, first
#    with PyTorch's pinned allocator, then with gpumem's installed into the same interpreter (a late
#    dlopen, no GLIBC_TUNABLES); torch.cuda.host_memory_stats() under each
# 4. tests/pinned/pinned_adapter.py: GPUMEM_ALLOC_CONF=pinned_allocator:gpumem through
#    libgpumem_torch.so: pin_memory, DataLoader(pin_memory=True), event semantics (a block whose copy
#    is queued behind a long kernel is not handed out again; the copy reads its data), host stats,
#    _host_emptyCache, a pinned snapshot read by `gpumem report --device -1`
# Every step has a timeout inside the budget (PINNED_BUDGET_S, default 80 s); a step cut for time
# says so. The table comes last in the summary. Exit status 0 when every step passed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
logs=$OUT/pinned-logs
mkdir -p "$logs"
summary=$OUT/pinned-summary.txt
: >"$summary"
trap 'tar czf "$OUT/pinned-logs.tar.gz" -C "$OUT" pinned-logs && rm -rf "$logs"' EXIT
status=0
budget=${PINNED_BUDGET_S:-80}
t_start=$SECONDS
note() { echo "$*" | tee -a "$summary"; }
fail() { note "$*"; status=1; }
# limit WANT: WANT seconds, or what is left of the budget (less 3 s for the table); 0 when nothing is
left_for() {
  local left=$((budget - (SECONDS - t_start) - 3))
  [ "$left" -lt 0 ] && left=0
  echo $(("$1" < left ? "$1" : left))
}
# run NAME WANT_S CMD...: runs CMD under a timeout into NAME.log; says whether it passed
run() {
  local name=$1 want=$2; shift 2
  local t; t=$(left_for "$want")
  if [ "$t" -lt 2 ]; then fail "$name: NOT RUN (the ${budget} s budget is spent)"; return 1; fi
  local t0=$SECONDS rc
  timeout --kill-after=3 "$t" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "$name: STOPPED after ${t} s (timeout; see $name.log)"; tail -15 "$logs/$name.log"; return 1
  fi
  if [ $rc -ne 0 ]; then
    fail "$name: FAILED (exit $rc in $((SECONDS - t0)) s; see $name.log)"; tail -25 "$logs/$name.log"; return 1
  fi
  echo "$name: ok in $((SECONDS - t0)) s" >>"$logs/times.txt"
  return 0
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1 | tee -a "$summary"
missing=0
for f in tests/pinned/test_pinned tests/pinned/test_pinned_torch bench/bench_pinned_cuda \
         bench/bench_pinned_dataloader torch/libgpumem_torch.so torch/libgpumem_pinned_torch.so; do
  if [ ! -e "$BUILD/$f" ]; then
    fail "MISSING: $BUILD/$f (build it with the full build of scripts/setup.sh: it needs libjemalloc-dev" \
         "and a CUDA libtorch; then scripts/gpu/stage.sh)"
    missing=1
  fi
done
[ "$missing" = 1 ] && exit 1
lib=$BUILD/torch/libgpumem_pinned_torch.so
tls_args=()

# ---- 1. tests
if run test_pinned 15 "$BUILD/tests/pinned/test_pinned" "~[symbols]" --order lex; then
  note "test_pinned: passed ($(grep -E 'All tests passed|test cases' "$logs/test_pinned.log" | tail -1))"
fi
if grep -q "no CUDA device" "$logs/test_pinned.log"; then fail "test_pinned: the [gpu] cases SKIPPED (no device seen)"; fi
if run test_pinned_torch 15 "$BUILD/tests/pinned/test_pinned_torch" --order lex; then
  if grep -q "no CUDA device" "$logs/test_pinned_torch.log"; then
    fail "test_pinned_torch: the [gpu] case SKIPPED (no device seen)"
  else
    note "test_pinned_torch: passed ($(grep -E 'All tests passed|test cases' "$logs/test_pinned_torch.log" | tail -1))"
  fi
fi

# ---- 2. C++ bandwidth and workloads (CudaHostSource directly)
for name in fixed multiscale; do
  scale=$([ $name = multiscale ] && echo 1 || echo 0)
  "$BUILD/bench/bench_pinned_dataloader" --steps 600 --multi-scale $scale --dump "$logs/$name.txt" \
    >"$logs/dump_$name.log" 2>&1 || fail "bench_pinned_dataloader --dump ($name): FAILED (dump_$name.log)"
  run "gpumem_$name" 10 "$BUILD/bench/bench_pinned_cuda" --steps 600 --multi-scale $scale
done

# ---- 3. through PyTorch's APIs: PyTorch's allocator, then gpumem's in the same interpreter
if [ -s "$logs/fixed.txt" ] && [ -s "$logs/multiscale.txt" ]; then
  if run torch_dataloader 30 env PYTHONUNBUFFERED=1 "$PY" bench/pinned_torch_dataloader.py \
       "$logs/fixed.txt" "$logs/multiscale.txt" --gpumem "$lib"; then
    note "pinned_torch_dataloader: ok (PyTorch's allocator, then gpumem's installed late without GLIBC_TUNABLES)"
  fi
  if grep -q "static TLS" "$logs/torch_dataloader.log"; then
    fail "  libgpumem_pinned_torch.so carries a jemalloc with initial-exec TLS: the build was configured" \
         "without scripts/stage_jemalloc.sh's jemalloc (GPUMEM_JEMALLOC_ROOT; scripts/setup.sh sets it);" \
         "measuring again with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384"
    mv "$logs/torch_dataloader.log" "$logs/torch_dataloader_static_tls.log"
    tls_args=(--initial-exec-tls)
    run torch_dataloader 30 env PYTHONUNBUFFERED=1 GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 "$PY" \
      bench/pinned_torch_dataloader.py "$logs/fixed.txt" "$logs/multiscale.txt" --gpumem "$lib" &&
      note "pinned_torch_dataloader: ok with GLIBC_TUNABLES"
  fi
fi

# ---- 4. the adapter from Python: pinned_allocator:gpumem, event semantics, stats, snapshot
cli=()
[ -x "$BUILD/cli/gpumem" ] && cli=(--gpumem-cli "$BUILD/cli/gpumem")
if run pinned_adapter 40 env PYTHONUNBUFFERED=1 "$PY" tests/pinned/pinned_adapter.py \
     --lib "$BUILD/torch/libgpumem_torch.so" "${cli[@]}" "${tls_args[@]}"; then
  if grep -q "skip the GPU cases" "$logs/pinned_adapter.log"; then
    fail "pinned_adapter: the GPU cases SKIPPED (torch saw no device)"
  else
    note "pinned_adapter: $(tail -1 "$logs/pinned_adapter.log")"
  fi
fi
grep -E '^(ok  |FAIL) GPU: ' "$logs/pinned_adapter.log" 2>/dev/null | sed 's/^/  /' | tee -a "$summary"

# ---- the table
result() {  # result FILE PATTERN KEY: KEY's value on the first RESULT line matching PATTERN, "-" if none
  local v
  v=$(grep -h "^RESULT $2" "$1" 2>/dev/null | head -1 | grep -oE "(^| )$3=[^ ]+" | head -1 | cut -d= -f2)
  echo "${v:--}"
}
gbps() {  # gbps FILE BYTES COLUMN: a column of bench_pinned_cuda's bandwidth table, "-" if none
  local v
  v=$(awk -v b="$2" -v c="$3" '$1 == b && NF == 4 { print $c; exit }' "$1" 2>/dev/null)
  echo "${v:--}"
}
tl=$logs/torch_dataloader.log
{
  echo
  echo "pinned host memory, DataLoader-style workload, 600 steps: peak locked / peak requested (target <= 1.1)"
  printf '%-12s %12s %18s %12s\n' workload gpumem_c++ gpumem_via_torch pytorch
  for name in fixed multiscale; do
    printf '%-12s %12s %18s %12s\n' "$name" "$(result "$logs/gpumem_$name.log" gpumem_locked gpumem_locked_over_requested)" \
      "$(result "$tl" "gpumem_${name}_" "gpumem_${name}_locked_over_requested")" \
      "$(result "$tl" "torch_${name}_" "torch_${name}_locked_over_requested")"
  done
  echo
  echo "host-to-device GB/s (target: gpumem pinned = PyTorch pinned)"
  printf '%-10s %11s %14s %13s %17s %9s\n' bytes gpumem_c++ cudaHostAlloc torch_pinned gpumem_via_torch pageable
  for mb in 1 16 64 256; do
    b=$((mb << 20))
    printf '%-10s %11s %14s %13s %17s %9s\n' "$b" "$(gbps "$logs/gpumem_fixed.log" $b 2)" \
      "$(gbps "$logs/gpumem_fixed.log" $b 3)" "$(result "$tl" "torch_h2d_gbps bytes=$b " pinned)" \
      "$(result "$tl" "gpumem_h2d_gbps bytes=$b " pinned)" "$(gbps "$logs/gpumem_fixed.log" $b 4)"
  done
  echo
  echo "torch.cuda.host_memory_stats() after the workloads:"
  echo "  pytorch: $(grep -h '^RESULT torch_host_stats' "$tl" 2>/dev/null | cut -d' ' -f3- || true)"
  echo "  gpumem:  $(grep -h '^RESULT gpumem_host_stats' "$tl" 2>/dev/null | cut -d' ' -f3- || true)"
  echo
  echo "pinned: $([ $status = 0 ] && echo PASSED || echo FAILED) in $((SECONDS - t_start)) s"
} | tee -a "$summary"
exit $status
