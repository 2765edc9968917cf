#!/usr/bin/env bash
# GPU machine: gpumem's forensics numbers that need the H200 host (about 4-6 minutes).
#
#   OUT=/some/dir scripts/gpu/forensics.sh
#
# 1. build (gpumem CLI, forensics tests, bench_snapshot_write, bench_op_attribution_overhead;
#    viewer off)
# 2. the forensics tests (CPU; they include torch.cuda._memory_viz rendering our pickles and the
#    op attribution + OOM postmortem through install_cpu)
# 3. bench_snapshot_write: a snapshot with 100,000 trace entries (op names included) written as
#    pickle; target <= 50 ms (PyTorch 2.11 on this host: _dump_snapshot 127 ms without stacks)
# 4. bench_op_attribution_overhead on CUDA: a GPT-style training step with attribution off and on;
#    target <= 3% slower
# 5. gpumem report on PyTorch's OOM snapshot (text and JSON)
# $OUT gets summary.txt (verdicts and numbers) and forensics_logs.tar.gz (every log). Exit status:
# 0 if every check passed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
build=${GPUMEM_GPU_BUILD:-$root/build-gpu}
summary=$OUT/summary.txt
LOGS=$OUT/logs
mkdir -p "$LOGS"
finish() {
  tar czf "$OUT/forensics_logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
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
{
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_PYTHON="$py" -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build "$build" -j "$(nproc)" --target gpumem bench_snapshot_write bench_op_attribution_overhead \
    forensics_test_snapshot_writer forensics_test_oom_report forensics_test_engine_forensics \
    forensics_test_observers forensics_test_report_cli forensics_test_op_attribution_torch
} >"$LOGS/build.log" 2>&1
if [ $? -ne 0 ]; then
  tail -40 "$LOGS/build.log"
  note "build: FAILED (see build.log)"
  exit 1
fi
note "build: ok in $((SECONDS - t0)) s"

step "forensics tests"
for t in forensics_test_snapshot_writer forensics_test_oom_report forensics_test_engine_forensics \
         forensics_test_observers forensics_test_report_cli forensics_test_op_attribution_torch; do
  bin=$(find "$build/tests" -name "$t" -type f -perm -u+x | head -1)
  if (cd "$root" && GPUMEM_SOURCE_DIR="$root" GPUMEM_SHARED_DIR="$root/../shared" GPUMEM_PYTHON="$py" \
        timeout 300 "$bin" --order lex >"$LOGS/$t.log" 2>&1); then
    note "$t: passed ($(grep -E 'test cases|All tests passed' "$LOGS/$t.log" | tail -1))"
  else
    note "$t: FAILED (see $t.log)"; tail -30 "$LOGS/$t.log"; status=1
  fi
done

step "bench_snapshot_write"
if timeout 120 "$build/bench/bench_snapshot_write" >"$LOGS/snapshot_write.log" 2>&1; then
  cat "$LOGS/snapshot_write.log"
  note "snapshot_write: $(grep 'write_snapshot to a file' "$LOGS/snapshot_write.log")"
  note "snapshot_write: $(grep '^pickle:' "$LOGS/snapshot_write.log")"
else
  note "bench_snapshot_write: FAILED"; status=1
fi

step "bench_op_attribution_overhead (CUDA)"
if timeout 300 "$build/bench/bench_op_attribution_overhead" --device cuda --phases 10 --steps-per-phase 20 \
     >"$LOGS/op_attribution_overhead.log" 2>&1; then
  cat "$LOGS/op_attribution_overhead.log"
  note "op attribution: $(grep -E '^attribution off' "$LOGS/op_attribution_overhead.log")"
  note "op attribution: $(grep -E '^attribution on' "$LOGS/op_attribution_overhead.log")"
  note "op attribution: $(grep -E '^overhead' "$LOGS/op_attribution_overhead.log")"
else
  note "bench_op_attribution_overhead: FAILED (see op_attribution_overhead.log)"; tail -20 "$LOGS/op_attribution_overhead.log"
  status=1
fi

step "bench_op_attribution_overhead parts (callbacks only, observers only)"
for part in callbacks observers; do
  if timeout 200 "$build/bench/bench_op_attribution_overhead" --device cuda --phases 6 --steps-per-phase 20 --on "$part" \
       >"$LOGS/op_attribution_overhead_$part.log" 2>&1; then
    note "op attribution ($part only): $(grep -E '^overhead' "$LOGS/op_attribution_overhead_$part.log")"
  else
    note "bench_op_attribution_overhead --on $part: FAILED"; status=1
  fi
done

step "gpumem report on PyTorch's OOM snapshot"
snap="$root/../shared/traces/native/oom.snapshot.pickle"
if [ -f "$snap" ]; then
  "$build/cli/gpumem" report "$snap" >"$LOGS/report_oom.txt" 2>&1
  "$build/cli/gpumem" report "$snap" --json >"$LOGS/report_oom.json" 2>&1
  note "report: $(grep -E 'OUT OF MEMORY' "$LOGS/report_oom.txt")"
fi
exit $status
