#!/usr/bin/env bash
# GPU machine: gpumem's forensics numbers that need the H200 host, on binaries staged from the CPU
# machine (scripts/gpu/stage.sh; nothing compiles here). Budget: BUDGET_S (default 70 s; run_all.sh
# gives it 75 s of wall time, so it ends on its own before run_all.sh stops it); every
# step is cut to the time left and says so when it is skipped.
#
#   OUT=/some/dir [BUDGET_S=70] scripts/gpu/forensics.sh
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
# $OUT gets forensics_summary.txt and logs/ (every step's whole output, one file each, written
# as the step runs). The summary ends with one line per step (its status, exit code, seconds and
# log) and names the steps that failed or were cut; a failed step's last lines are copied into
# the summary too, so the cause travels with it when logs/ does not.
# Exit status: 0 if every step ran and passed; 1 if a check failed (a test, a bench that exited
# non-zero or crashed); 2 if none failed but a step was cut or skipped because the budget ran out.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
root=$gpu_root
OUT=${OUT:-$root/.gpu/out/forensics}
BUDGET_S=${BUDGET_S:-70}
summary=$OUT/forensics_summary.txt
LOGS=$OUT/logs
mkdir -p "$LOGS"
: >"$summary"
status=0
steps_table=()   # one line per step that ran or was skipped
failed=()        # steps whose check failed
cut=()           # steps cut or skipped by the budget
note() { echo "$*" | tee -a "$summary"; }
current="start"
step() { current=$*; echo; echo "=== $* ($(date +%T), ${SECONDS}s of ${BUDGET_S}s)"; }
left() { echo $((BUDGET_S - 3 - SECONDS)); }
# run_for MAX_S LOG cmd...: runs cmd with a timeout of min(MAX_S, time left), its output in LOG
# (which starts with the command and the timeout, so a log alone says what ran); 125 when no time
# is left, 124 when the timeout cut it.
run_for() {
  local max=$1 log=$2 t
  shift 2
  t=$(left)
  [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -le 1 ]; then echo "skipped: no time left (${SECONDS}s of ${BUDGET_S}s)" >"$log"; return 125; fi
  { echo "# $(date +%T) timeout ${t}s (budget left $(left)s): $*"; } >"$log"
  timeout "$t" "$@" >>"$log" 2>&1
}
# record NAME RC SECONDS LOG [ok-codes...]: files the step's outcome. 124 (cut by its timeout)
# and 125 (no time left) are budget cuts, anything else non-zero a failure, whose log's last
# lines go into the summary.
record() {
  local name=$1 rc=$2 secs=$3 log=$4 what
  if [ "$rc" -eq 0 ]; then what=passed
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 125 ]; then
    what="CUT by the budget"; cut+=("$name"); [ $status -eq 0 ] && status=2
  else
    what=FAILED; failed+=("$name"); status=1
    { echo "  --- last lines of ${log#"$OUT"/}:"; tail -20 "$log" 2>/dev/null | sed 's/^/  | /'; } | tee -a "$summary"
  fi
  steps_table+=("$(printf '  %-34s %-18s rc %-3s %4ss  %s' "$name" "$what" "$rc" "$secs" "${log#"$OUT"/}")")
}
# missing NAME WHAT: a step that could not run because the staged build lacks WHAT (a failure).
missing() {
  note "$1: FAILED ($2 missing from the staged build)"
  failed+=("$1"); status=1
  steps_table+=("$(printf '  %-34s %-18s %s' "$1" "FAILED" "$2 missing")")
}
shared=${GPUMEM_SHARED_DIR:-$root/../shared}
[ -d "$shared/traces" ] || shared=$root/shared
gpumem=$BUILD/cli/gpumem
note "forensics: build $BUILD, budget ${BUDGET_S}s"
# Stopped from outside (run_all.sh's timeout sends TERM): say where, with what was recorded so far.
on_term() {
  note "forensics: STOPPED by a signal at ${SECONDS}s, during: $current"
  for line in "${steps_table[@]}"; do note "$line"; done
  exit 124
}
trap on_term TERM INT

step "gpumem report / diff / replay on PyTorch's OOM snapshot"
snap=$shared/traces/native/oom.snapshot.pickle
if [ ! -x "$gpumem" ]; then
  missing "report" "$gpumem"
elif [ ! -f "$snap" ]; then
  note "report: skipped (no $snap)"
else
  t0=$SECONDS; run_for 15 "$LOGS/report_oom.txt" "$gpumem" report "$snap"; rc=$?
  record "report" $rc $((SECONDS - t0)) "$LOGS/report_oom.txt"
  note "report (rc $rc): $(grep -m1 -E 'verdict' "$LOGS/report_oom.txt")"
  grep -m3 -iE 'replay|advice' "$LOGS/report_oom.txt" | sed 's/^/  /' | tee -a "$summary"
  t0=$SECONDS; run_for 10 "$LOGS/report_oom_json.log" "$gpumem" report "$snap" --json --no-replay; rc=$?
  record "report --json" $rc $((SECONDS - t0)) "$LOGS/report_oom_json.log"
  note "report --json (rc $rc): $(grep -v '^#' "$LOGS/report_oom_json.log" | head -c 300 | tr -d '\n')"
  t0=$SECONDS; run_for 10 "$LOGS/diff_oom.txt" "$gpumem" diff "$snap" "$snap" --at-a peak --at-b oom --top 5; rc=$?
  record "diff" $rc $((SECONDS - t0)) "$LOGS/diff_oom.txt"
  note "diff peak->oom (rc $rc): $(grep -m1 -E '^ +reserved ' "$LOGS/diff_oom.txt")"
  t0=$SECONDS; run_for 10 "$LOGS/replay_oom.txt" "$gpumem" replay "$snap"; rc=$?
  record "replay" $rc $((SECONDS - t0)) "$LOGS/replay_oom.txt"
  note "replay (rc $rc): $(grep -m2 -iE 'cap|limit' "$LOGS/replay_oom.txt" | tr '\n' ' ')"
fi

step "forensics tests (CPU)"
for t in forensics_test_oom_report forensics_test_report_cli forensics_test_engine_forensics forensics_test_observers; do
  bin=$BUILD/tests/forensics/$t
  # These two read PyTorch's shared OOM trace; the GPU machine has no copy (CI runs them).
  if [ ! -d "$shared/traces" ] && { [ "$t" = forensics_test_oom_report ] || [ "$t" = forensics_test_report_cli ]; }; then
    note "$t: skipped (needs the shared traces, absent here; CI and the CPU machine run it)"; continue
  fi
  if [ ! -x "$bin" ]; then missing "$t" "$bin"; continue; fi
  # --durations yes: each test case's time in the log (a case near the timeout shows there)
  t0=$SECONDS
  (cd "$root" && GPUMEM_SHARED_DIR="$shared" run_for 20 "$LOGS/$t.log" "$bin" --order lex --durations yes)
  rc=$?
  record "$t" $rc $((SECONDS - t0)) "$LOGS/$t.log"
  if [ $rc -eq 0 ]; then note "$t: passed ($(grep -E 'test cases|All tests passed' "$LOGS/$t.log" | tail -1))"
  elif [ $rc -ge 124 ]; then note "$t: cut by the budget (rc $rc, see logs/$t.log)"
  else note "$t: FAILED rc $rc (see logs/$t.log)"; fi
done

step "bench_snapshot_write"
t0=$SECONDS; run_for 15 "$LOGS/snapshot_write.log" "$BUILD/bench/bench_snapshot_write"; rc=$?
record "bench_snapshot_write" $rc $((SECONDS - t0)) "$LOGS/snapshot_write.log"
if [ $rc -eq 0 ]; then
  note "snapshot_write: $(grep 'write_snapshot to a file' "$LOGS/snapshot_write.log")"
  note "snapshot_write: $(grep '^pickle:' "$LOGS/snapshot_write.log")"
else
  note "bench_snapshot_write: rc $rc (see logs/snapshot_write.log)"
fi

step "bench_forensics_observers (the ring's and the tracker's cost per alloc+free pair, host CPU)"
t0=$SECONDS
run_for 12 "$LOGS/forensics_observers.log" "$BUILD/bench/bench_forensics_observers" --ops 100000 --rounds 3; rc=$?
record "bench_forensics_observers" $rc $((SECONDS - t0)) "$LOGS/forensics_observers.log"
if [ $rc -eq 0 ]; then
  grep -E '^(plain|trace|ops|postmortem)' "$LOGS/forensics_observers.log" | sed 's/^/  observers: /' | tee -a "$summary"
else
  note "bench_forensics_observers: rc $rc (see logs/forensics_observers.log)"
fi

step "python stacks on CUDA (oom_report_dir alone names the Python line; cost per allocation)"
lib=$BUILD/torch/libgpumem_torch.so
if [ ! -f "$lib" ]; then
  missing "python stacks (cuda)" "$lib"
else
  t0=$SECONDS
  (cd "$root" && run_for 30 "$LOGS/python_stacks.log" "$PY" tests/forensics/python_stacks_check.py \
     --lib "$lib" --device cuda --quick --bench)
  rc=$?
  record "python stacks (cuda)" $rc $((SECONDS - t0)) "$LOGS/python_stacks.log"
  note "python stacks: rc $rc"
  grep -E "^ok: auto: the report|^FAIL|KiB|ns per pair" "$LOGS/python_stacks.log" | sed 's/^/  /' | tee -a "$summary"
fi

step "bench_op_attribution_overhead (CUDA)"
t=$(left)
# With the breakdown, the full run leaves time for the two partial ones.
[ "${ATTRIBUTION_BREAKDOWN:-0}" = 1 ] && [ "$t" -gt 20 ] && t=20
if [ "$t" -lt 12 ]; then
  note "op attribution: skipped (${t}s left)"
  record "bench_op_attribution_overhead" 125 0 "$LOGS/op_attribution_overhead.log"
else
  t0=$SECONDS
  run_for "$t" "$LOGS/op_attribution_overhead.log" "$BUILD/bench/bench_op_attribution_overhead" \
    --device cuda --phases 6 --steps-per-phase 10
  rc=$?
  record "bench_op_attribution_overhead" $rc $((SECONDS - t0)) "$LOGS/op_attribution_overhead.log"
  for k in '^attribution off' '^attribution on' '^overhead'; do
    line=$(grep -E "$k" "$LOGS/op_attribution_overhead.log") && note "op attribution: $line"
  done
fi
if [ "${ATTRIBUTION_BREAKDOWN:-0}" = 1 ]; then
  for part in callbacks observers; do
    t=$(left)
    if [ "$t" -lt 12 ]; then
      note "op attribution --on $part: skipped (${t}s left)"
      record "op attribution --on $part" 125 0 "$LOGS/op_attribution_$part.log"; continue
    fi
    t0=$SECONDS
    run_for "$t" "$LOGS/op_attribution_$part.log" "$BUILD/bench/bench_op_attribution_overhead" \
      --device cuda --phases 6 --steps-per-phase 10 --on "$part"
    rc=$?
    record "op attribution --on $part" $rc $((SECONDS - t0)) "$LOGS/op_attribution_$part.log"
    note "op attribution --on $part: $(grep -E '^overhead' "$LOGS/op_attribution_$part.log") ($(grep -E '^attribution off' "$LOGS/op_attribution_$part.log"))"
  done
fi
note ""
note "steps (status, exit code, seconds, log under $OUT):"
for line in "${steps_table[@]}"; do note "$line"; done
[ ${#failed[@]} -eq 0 ] || note "FAILED steps: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
[ ${#cut[@]} -eq 0 ] || note "CUT or skipped by the ${BUDGET_S}s budget: $(IFS=,; echo "${cut[*]}" | sed 's/,/, /g')"
note "forensics: done in ${SECONDS}s, status $status"
exit $status
