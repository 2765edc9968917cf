#!/usr/bin/env bash
# Issue 15 on the H200 (budget 100 s wall; prebuilt binaries from .gpu/build, never compiles):
#   1. growth_faults     driver faults mid-growth on the engine (test_growth_faults; SimSource stands in
#                        for cuMemCreate/cuMemMap failures: a CPU test, run here to prove the binaries)
#   2. memcheck_streams  compute-sanitizer memcheck over the adapter's multi-stream record_stream stress
#                        (torch_cuda_allocator "gpu 2", data checked): no invalid access, no error
#   3. memcheck_vmm      compute-sanitizer memcheck over CudaVmmSource's conformance cases
# Needs in BUILD: tests/allocator/test_growth_faults, tests/torch/torch_cuda_allocator,
# tests/allocator/test_memory_source. Writes $OUT/reliability-summary.txt and
# $OUT/reliability-logs.tar.gz; prints the summary last. --dry-run prints the steps only.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
OUT=${OUT:-$PWD/out-reliability}
dry=0; [ "${1:-}" = "--dry-run" ] && dry=1
logs=$(mktemp -d); mkdir -p "$OUT"
summary=()
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)

step() {  # step NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  if [ $dry = 1 ]; then echo "would run ($secs s): $*"; summary+=("$name: dry run"); return; fi
  local t0=$SECONDS rc
  timeout --kill-after=5 "$secs" "$@" >"$logs/$name.log" 2>&1; rc=$?
  local took=$((SECONDS - t0))
  if [ $rc = 0 ]; then
    summary+=("$name: ok (${took} s)")
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    summary+=("$name: CUT at ${secs} s (timeout; see $name.log)")
  else
    summary+=("$name: FAILED (exit $rc, ${took} s; see $name.log)")
    echo "---- $name (exit $rc): last lines"; tail -25 "$logs/$name.log"
  fi
}

need() { [ -x "$1" ] || { summary+=("$2: MISSING $1 (build it on the CPU machine)"); return 1; }; }

if need "$BUILD/tests/allocator/test_growth_faults" growth_faults; then
  step growth_faults 20 "$BUILD/tests/allocator/test_growth_faults" --order lex
fi
if [ -z "$sanitizer" ]; then
  summary+=("memcheck_streams: SKIPPED (no compute-sanitizer)" "memcheck_vmm: SKIPPED (no compute-sanitizer)")
else
  if need "$BUILD/tests/torch/torch_cuda_allocator" memcheck_streams; then
    step memcheck_streams 55 "$sanitizer" --tool memcheck --error-exitcode 3 --leak-check no \
      "$BUILD/tests/torch/torch_cuda_allocator" "gpu 2: record_stream keeps blocks from early reuse under stress"
  fi
  if need "$BUILD/tests/allocator/test_memory_source" memcheck_vmm; then
    # The conformance cases provoke driver errors on purpose (out of memory at capacity, bad
    # arguments); memcheck is here for memory accesses, so API errors are not counted.
    step memcheck_vmm 20 "$sanitizer" --tool memcheck --error-exitcode 3 --report-api-errors no \
      "$BUILD/tests/allocator/test_memory_source" "[cuda_vmm]"
  fi
fi

printf '%s\n' "${summary[@]}" > "$OUT/reliability-summary.txt"
tar czf "$OUT/reliability-logs.tar.gz" -C "$logs" . 2>/dev/null
rm -rf "$logs"
echo "==== reliability (issue 15) summary"
cat "$OUT/reliability-summary.txt"
grep -q 'FAILED\|MISSING' "$OUT/reliability-summary.txt" && exit 1
exit 0
