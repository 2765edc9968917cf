#!/usr/bin/env bash
# GPU machine, one-off diagnosis for issues 16/17 (mid-session call; about 75 s, at most 90 s):
#   1. tests/pinned/pinned_adapter.py: torch.cuda.host_memory_stats() right after pinning under
#      gpumem, read through the raw binding before torch.cuda.init() and through host_memory_stats()
#      after it; the same rule under PyTorch's pinned allocator.
#   2. scripts/gpu/graphs/graphs_check.py --parts compile, gpumem then native: where the reserved
#      memory of the reduce-overhead run is (per pool and segment type), and both snapshots.
#
#   OUT=/dir scripts/gpu/dropin_diag.sh     ($OUT gets dropin-diag-summary.txt, dropin-diag-logs.tar.gz)
#
# Needs in BUILD: torch/libgpumem_torch.so, torch/libgpumem_pinned_torch.so, cli/gpumem.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
logs=$OUT/dropin-diag-logs
mkdir -p "$logs"
summary=$OUT/dropin-diag-summary.txt
: >"$summary"
trap 'tar czf "$OUT/dropin-diag-logs.tar.gz" -C "$OUT" dropin-diag-logs && rm -rf "$logs"' EXIT
note() { echo "$*" | tee -a "$summary"; }
t_all=$SECONDS

# ---- 1. pinned host stats
cli=()
[ -x "$BUILD/cli/gpumem" ] && cli=(--gpumem-cli "$BUILD/cli/gpumem")
timeout --kill-after=3 28 env PYTHONUNBUFFERED=1 "$PY" tests/pinned/pinned_adapter.py \
  --lib "$BUILD/torch/libgpumem_torch.so" "${cli[@]}" >"$logs/pinned_adapter.log" 2>&1
note "pinned_adapter: exit $? in $((SECONDS - t_all)) s: $(tail -1 "$logs/pinned_adapter.log")"
grep -E '^(ok  |FAIL) ' "$logs/pinned_adapter.log" | sed 's/^/  /' | tee -a "$summary"

# ---- 2. reduce-overhead: where the reserved memory is
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpumem-graphs-inductor}
export CUBLAS_WORKSPACE_CONFIG=:4096:8
results=$logs/results
mkdir -p "$results"
for alloc in gpumem native; do
  t0=$SECONDS
  limit=$((66 - (SECONDS - t_all))); [ $alloc = gpumem ] && [ $limit -gt 38 ] && limit=38
  [ $limit -lt 5 ] && { note "graphs_check $alloc: NOT RUN (budget spent)"; continue; }
  args=(run --allocator "$alloc" --out "$results" --device cuda --steps 8 --parts compile --snapshot-dir "$results")
  [ $alloc = gpumem ] && args+=(--lib "$BUILD/torch/libgpumem_torch.so")
  timeout --kill-after=3 "$limit" "$PY" scripts/gpu/graphs/graphs_check.py "${args[@]}" >"$logs/run_$alloc.log" 2>&1
  note "graphs_check $alloc (compile only): exit $? in $((SECONDS - t0)) s (limit $limit s)"
done
timeout 10 "$PY" scripts/gpu/graphs/graphs_check.py compare "$results" >"$logs/compare.log" 2>&1
tee -a "$summary" <"$logs/compare.log"
# Variants of gpumem's configuration, while the budget lasts (each about 15 s with the warm
# inductor cache): which setting the extra reserved memory follows.
for conf in expandable_segments:False thread_cache:False recycle:False; do
  limit=$((76 - (SECONDS - t_all))); [ $limit -gt 20 ] && limit=20
  [ $limit -lt 12 ] && { note "gpumem $conf: NOT RUN (budget spent)"; continue; }
  dir=$logs/variant_${conf%%:*}
  t0=$SECONDS
  GPUMEM_ALLOC_CONF=$conf timeout --kill-after=3 "$limit" "$PY" scripts/gpu/graphs/graphs_check.py run \
    --allocator gpumem --lib "$BUILD/torch/libgpumem_torch.so" --out "$dir" --device cuda --steps 8 \
    --parts compile >"$dir.log" 2>&1
  rc=$?
  note "gpumem GPUMEM_ALLOC_CONF=$conf: exit $rc in $((SECONDS - t0)) s: $("$PY" -c '
import json, sys
c = json.load(open(sys.argv[1]))["parts"]["compile"]
print("peak reserved %.1f MiB, peak allocated %.1f MiB; at end: %s" % (c["peak_reserved_mib"], c["peak_allocated_mib"],
      "; ".join("%s: %d, %.1f/%.1f" % (k, e["segments"], e["reserved_mib"], e["allocated_mib"]) for k, e in c["pools_at_end"].items())))
' "$dir/gpumem.json" 2>&1 | tail -1)"
done
if [ -x "$BUILD/cli/gpumem" ] && [ $((SECONDS - t_all)) -lt 78 ]; then
  for alloc in gpumem native; do
    f=$results/${alloc}_compile.pickle
    [ -f "$f" ] && timeout 5 "$BUILD/cli/gpumem" report "$f" >"$logs/report_$alloc.txt" 2>&1
  done
fi
note "dropin_diag: done in $((SECONDS - t_all)) s"
