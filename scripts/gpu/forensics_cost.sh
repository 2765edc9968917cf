#!/usr/bin/env bash
# GPU machine: what gpumem's trace recording and op attribution cost on GPT-2 varlen training,
# beside PyTorch's _record_memory_history, each paired inside one process (issue 14's 3% target;
# scripts/gpu/forensics_cost.py's docstring says how). Two processes, one after the other:
#   1. gpumem (plain config): blocks with nothing / the trace (100,000 records) / op attribution,
#      switched at run time, plus the per-op cost of the attribution callbacks (--micro)
#   2. PyTorch's allocator: blocks with nothing / _record_memory_history (its defaults: stacks) /
#      _record_memory_history(context=None) (the trace alone)
# About GPUMEM_S + NATIVE_S seconds (default 58 + 42) plus a few (each process is stopped 10 s after
# its budget at the latest); nothing compiles here.
#
#   OUT=/dir [GPUMEM_S=58] [NATIVE_S=42] [WORKLOAD=gpt2_varlen_train] scripts/gpu/forensics_cost.sh [PATH/libgpumem_torch.so]
#
# The library: the argument, else $BUILD/torch/libgpumem_torch.so (scripts/gpu/env.sh's BUILD).
# OUT receives gpumem.json, native.json (every block's step times and the statistics),
# gpumem.log, native.log and forensics_cost_summary.txt (both tables; printed last).
# Exit status: 0 when both processes finished; 1 when one failed (its log's end is in the summary).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
: "${OUT:?set OUT to the directory for results}"
mkdir -p "$OUT" || { echo "forensics_cost.sh: cannot create OUT=$OUT" >&2; exit 2; }
lib=${1:-$BUILD/torch/libgpumem_torch.so}
[ -f "$lib" ] || { echo "forensics_cost.sh: no $lib (stage a build with scripts/gpu/stage.sh, or pass the library's path)" >&2; exit 2; }
GPUMEM_S=${GPUMEM_S:-58}
NATIVE_S=${NATIVE_S:-42}
WORKLOAD=${WORKLOAD:-gpt2_varlen_train}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF GPUMEM_ALLOC_CONF
summary=$OUT/forensics_cost_summary.txt
: >"$summary"
status=0
run() {  # NAME BUDGET args...
  local name=$1 budget=$2 rc
  shift 2
  echo "=== $name ($(date -u +%T), budget ${budget}s): $PY $here/forensics_cost.py $*" | tee -a "$summary"
  timeout --kill-after=3 $((${budget%.*} + 7)) "$PY" "$here/forensics_cost.py" --budget-s "$budget" \
    --workload "$WORKLOAD" --out "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    sed -n '/ process: /,$p' "$OUT/$name.log" >>"$summary"
  else
    status=1
    { echo "--- $name FAILED (exit $rc); last lines of $name.log:"; tail -25 "$OUT/$name.log" | sed 's/^/  | /'; } >>"$summary"
  fi
}
{ date -u; timeout 10 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1; } | tee -a "$summary"
run gpumem "$GPUMEM_S" --allocator gpumem --lib "$lib" --micro
run native "$NATIVE_S" --allocator native
cat "$summary"
exit $status
