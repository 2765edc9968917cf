#!/usr/bin/env bash
# GPU machine: gpumem's forensics numbers that need the H200 host, on binaries staged from the CPU
# machine (scripts/gpu/stage.sh; nothing compiles here). Budget: 55 s wall (run_all.sh); every
# step is cut to the time left and says so when it is skipped.
#
#   OUT=/some/dir scripts/gpu/forensics.sh        (run_all.sh: "forensics 55 .../forensics.sh")
#
# Needs in $BUILD (.gpu/build): cli/gpumem, bench/bench_snapshot_write,
# bench/bench_op_attribution_overhead, bench/bench_forensics_observers,
# tests/forensics/forensics_test_{oom_report,report_cli,
# engine_forensics,observers}, torch/libgpumem_torch.so (python stacks; $PY with torch).
# 1. gpumem report / diff / replay on PyTorch's OOM snapshot (the shared traces): verdict, the
#    replay under the recorded cap, the number format
# 2. the quick forensics tests (CPU)
# 3. bench_snapshot_write: a snapshot with 100,000 trace entries written as pickle; target <= 50 ms
# 4. bench_forensics_observers: what the trace ring, the tracker and the postmortem add to an
#    engine alloc+free pair (SimSource; the host's CPU), against plain gpumem
# 5. python stacks on CUDA (tests/forensics/python_stacks_check.py --device cuda --quick --bench):
#    an OOM under memory_limit_mb:64 with oom_report_dir alone, whose report names the Python
#    line; alloc+free pairs from Python with python_stacks off, auto (default bound: >= 1 MiB)
#    and python_stacks_min_kb:0 (ns per pair)
# 6. bench_op_attribution_overhead on CUDA: a GPT-style step with attribution (RecordFunction
#    callbacks + trace ring + record_ops) off and on, alternating phases; target <= 3% slower.
#    ATTRIBUTION_BREAKDOWN=1 also runs it with only the callbacks and only the observers on (when
#    the time left allows; each run takes about 8 s there)
# $OUT gets forensics_summary.txt and the logs. Exit status: 0 if every check that ran passed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
root=$gpu_root
OUT=${OUT:-$root/.gpu/out/forensics}
BUDGET_S=${BUDGET_S:-55}
summary=$OUT/forensics_summary.txt
LOGS=$OUT/logs
mkdir -p "$LOGS"
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
step() { echo; echo "=== $* ($(date +%T), ${SECONDS}s of ${BUDGET_S}s)"; }
left() { echo $((BUDGET_S - 3 - SECONDS)); }
# run_for MAX_S LOG cmd...: runs cmd with a timeout of min(MAX_S, time left); 125 when no time is left
run_for() {
  local max=$1 log=$2 t
  shift 2
  t=$(left)
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -le 1 ]; then echo "skipped: no time left" >"$log"; return 125; fi
  timeout "$t" "$@" >"$log" 2>&1
}
shared=${GPUMEM_SHARED_DIR:-$root/../shared}
[ -d "$shared/traces" ] || shared=$root/shared
gpumem=$BUILD/cli/gpumem
note "forensics: build $BUILD, budget ${BUDGET_S}s"

step "gpumem report / diff / replay on PyTorch's OOM snapshot"
snap=$shared/traces/native/oom.snapshot.pickle
if [ ! -x "$gpumem" ]; then
  note "report: FAILED ($gpumem missing from the staged build)"; status=1
elif [ ! -f "$snap" ]; then
  note "report: skipped (no $snap)"
else
  run_for 15 "$LOGS/report_oom.txt" "$gpumem" report "$snap"
  rc=$?
  note "report (rc $rc): $(grep -m1 -E 'verdict' "$LOGS/report_oom.txt")"
  grep -m3 -iE 'replay|advice' "$LOGS/report_oom.txt" | sed 's/^/  /' | tee -a "$summary"
  [ $rc -eq 0 ] || status=1
  run_for 10 "$LOGS/report_oom.json" "$gpumem" report "$snap" --json --no-replay
  note "report --json (rc $?): $(head -c 300 "$LOGS/report_oom.json" | tr -d '\n')"
  run_for 10 "$LOGS/diff_oom.txt" "$gpumem" diff "$snap" "$snap" --at-a peak --at-b oom --top 5
  note "diff peak->oom (rc $?): $(grep -m1 -E '^ +reserved ' "$LOGS/diff_oom.txt")"
  run_for 10 "$LOGS/replay_oom.txt" "$gpumem" replay "$snap"
  note "replay (rc $?): $(grep -m2 -iE 'cap|limit' "$LOGS/replay_oom.txt" | tr '\n' ' ')"
fi

step "forensics tests (CPU)"
for t in forensics_test_oom_report forensics_test_report_cli forensics_test_engine_forensics forensics_test_observers; do
  bin=$BUILD/tests/forensics/$t
  # These two read PyTorch's shared OOM trace; the GPU machine has no copy (CI runs them).
  if [ ! -d "$shared/traces" ] && { [ "$t" = forensics_test_oom_report ] || [ "$t" = forensics_test_report_cli ]; }; then
    note "$t: skipped (needs the shared traces, absent here; CI and the CPU machine run it)"; continue
  fi
  if [ ! -x "$bin" ]; then note "$t: FAILED (missing)"; status=1; continue; fi
  (cd "$root" && GPUMEM_SHARED_DIR="$shared" run_for 20 "$LOGS/$t.log" "$bin" --order lex)
  rc=$?
  if [ $rc -eq 0 ]; then note "$t: passed ($(grep -E 'test cases|All tests passed' "$LOGS/$t.log" | tail -1))"
  elif [ $rc -eq 125 ]; then note "$t: skipped (no time left)"
  else note "$t: FAILED rc $rc (see logs/$t.log)"; tail -15 "$LOGS/$t.log"; status=1; fi
done

step "bench_snapshot_write"
if run_for 15 "$LOGS/snapshot_write.log" "$BUILD/bench/bench_snapshot_write"; then
  note "snapshot_write: $(grep 'write_snapshot to a file' "$LOGS/snapshot_write.log")"
  note "snapshot_write: $(grep '^pickle:' "$LOGS/snapshot_write.log")"
else
  note "bench_snapshot_write: FAILED or cut (rc $?; see logs/snapshot_write.log)"; status=1
fi

step "bench_forensics_observers (the ring's and the tracker's cost per alloc+free pair, host CPU)"
if run_for 8 "$LOGS/forensics_observers.log" "$BUILD/bench/bench_forensics_observers" --ops 100000 --rounds 3; then
  grep -E '^(plain|trace|ops|postmortem)' "$LOGS/forensics_observers.log" | sed 's/^/  observers: /' | tee -a "$summary"
else
  note "bench_forensics_observers: FAILED or cut (rc $?; see logs/forensics_observers.log)"; status=1
fi

step "python stacks on CUDA (oom_report_dir alone names the Python line; cost per allocation)"
lib=$BUILD/torch/libgpumem_torch.so
if [ ! -f "$lib" ]; then
  note "python stacks: FAILED ($lib missing from the staged build)"; status=1
else
  (cd "$root" && run_for 30 "$LOGS/python_stacks.log" "$PY" tests/forensics/python_stacks_check.py \
     --lib "$lib" --device cuda --quick --bench)
  rc=$?
  if [ $rc -eq 0 ]; then note "python stacks: passed"
  elif [ $rc -eq 125 ]; then note "python stacks: skipped (no time left)"
  else note "python stacks: FAILED or cut rc $rc (see logs/python_stacks.log)"; tail -12 "$LOGS/python_stacks.log"; status=1; fi
  grep -E "^ok: auto: the report|^FAIL|KiB|ns per pair" "$LOGS/python_stacks.log" | sed 's/^/  /' | tee -a "$summary"
fi

step "bench_op_attribution_overhead (CUDA)"
t=$(left)
# With the breakdown, the full run leaves time for the two partial ones.
[ "${ATTRIBUTION_BREAKDOWN:-0}" = 1 ] && [ "$t" -gt 20 ] && t=20
if [ "$t" -lt 12 ]; then
  note "op attribution: skipped (${t}s left)"
elif run_for "$t" "$LOGS/op_attribution_overhead.log" "$BUILD/bench/bench_op_attribution_overhead" \
       --device cuda --phases 6 --steps-per-phase 10; then
  for k in '^attribution off' '^attribution on' '^overhead'; do
    note "op attribution: $(grep -E "$k" "$LOGS/op_attribution_overhead.log")"
  done
else
  note "op attribution: FAILED or cut at the budget (rc $?; see logs/op_attribution_overhead.log)"
  tail -8 "$LOGS/op_attribution_overhead.log"; status=1
fi
if [ "${ATTRIBUTION_BREAKDOWN:-0}" = 1 ]; then
  for part in callbacks observers; do
    t=$(left)
    if [ "$t" -lt 12 ]; then note "op attribution --on $part: skipped (${t}s left)"; continue; fi
    if run_for "$t" "$LOGS/op_attribution_$part.log" "$BUILD/bench/bench_op_attribution_overhead" \
         --device cuda --phases 6 --steps-per-phase 10 --on "$part"; then
      note "op attribution --on $part: $(grep -E '^overhead' "$LOGS/op_attribution_$part.log") ($(grep -E '^attribution off' "$LOGS/op_attribution_$part.log"))"
    else
      note "op attribution --on $part: FAILED or cut (see logs/op_attribution_$part.log)"
    fi
  done
fi
note "forensics: done in ${SECONDS}s, status $status"
exit $status
