#!/usr/bin/env bash
# Every GPU check of the project in one device call, with binaries staged by scripts/gpu/stage.sh
# (nothing compiles on the GPU machine). Each script runs under its own wall-time budget, in its own
# results folder; at the end the folders are packed into $OUT/gpu-results.tar.gz and every
# script's summary is gathered into $OUT/gpu-summary.txt (two files: the device tool brings back at
# most eight).
#
#   OUT=/dir scripts/gpu/run_all.sh [NAME ...]      (default: every script below, in this order)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
: "${OUT:?set OUT}"
mkdir -p "$OUT" || { echo "run_all.sh: cannot create OUT=$OUT" >&2; exit 2; }
work=${GPU_WORK:-/tmp/gpumem-gpu}
rm -rf "$work"; mkdir -p "$work"
# name  budget-seconds  command
plan=(
  "regression 75 $here/regression.sh"
  "speed 100 $here/speed.sh"
  "torch_pairs 140 env TORCH_PAIRS_DEADLINE_S=100 $here/torch_pairs_reps.sh"
  "reliability 100 $here/reliability.sh"
  "graphs 130 $here/graphs.sh"
  "package 55 $here/package.sh"
  "pinned 85 $here/pinned.sh"
  "forensics 75 env BUDGET_S=70 $here/forensics.sh"
  "forensics_cost 130 $here/forensics_cost.sh"
  "zero 70 env NGPU=1 $here/zero_fsdp2.sh"
)
want=("$@")
summary=$OUT/gpu-summary.txt
: >"$summary"
t_all=$SECONDS
for entry in "${plan[@]}"; do
  read -r name budget cmd <<<"$entry"
  if [ ${#want[@]} -gt 0 ] && ! printf '%s\n' "${want[@]}" | grep -qx "$name"; then continue; fi
  script=${entry##* }
  if [ ! -f "$script" ]; then echo "=== $name: no script ($script)" | tee -a "$summary"; continue; fi
  mkdir -p "$work/$name"
  echo "=== $name (budget ${budget} s) $(date +%T)" | tee -a "$summary"
  t0=$SECONDS
  OUT=$work/$name timeout --kill-after=10 "$budget" $cmd >"$work/$name/stdout.log" 2>&1
  rc=$?
  verdict="exit $rc"; [ $rc -ge 124 ] && verdict="STOPPED at its budget (exit $rc)"
  echo "--- $name: $verdict in $((SECONDS - t0)) s" | tee -a "$summary"
  # the script's own summary, else the end of its output
  s=$(ls "$work/$name"/*summary*.txt 2>/dev/null | head -1)
  if [ -n "$s" ]; then cat "$s" >>"$summary"; else tail -30 "$work/$name/stdout.log" >>"$summary"; fi
  # A script that did not pass: the end of its own output too (what its summary may not say).
  if [ $rc -ne 0 ] && [ -n "$s" ]; then
    { echo "--- $name: last lines of its output:"; tail -30 "$work/$name/stdout.log" | sed 's/^/  | /'; } >>"$summary"
  fi
done
echo "=== all done in $((SECONDS - t_all)) s" | tee -a "$summary"
tar czf "$OUT/gpu-results.tar.gz" -C "$work" . 2>/dev/null
cat "$summary"
