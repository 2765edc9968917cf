#!/usr/bin/env bash
# Issue 13's profiles on the GPU host, which has no perf: where the CPU time of PyTorch's allocator
# and gpumem's goes, sampled by libgpumem_sampler.so (bench/sampling_profiler.cpp) in binaries
# staged by scripts/gpu/stage.sh (nothing is compiled here).
#
#   OUT=/dir scripts/gpu/profile.sh [WORKLOAD]...
#
# Default workloads: torch_alloc_pairs (the C++ benchmark, PyTorch's allocator and gpumem's in one
# process, sampled whole; torch_pairs_arenas, not a default, samples gpumem alone with arenas:4 on the
# windows), engine_pairs_threads (bench_alloc_pairs' window patterns on the engine
# alone, one thread then 4 threads, sampled whole: where the 4-thread windows' time goes), alloc_loop (a Python loop of 20,000 torch.empty a step, 512 B..4 MiB)
# and gpt2_generate (GPT-2 generate(), the loop of issue 13's step-time row). Each Python workload
# runs under native and gpumem, PROFILE_REPS times (default 2), alternated, each a fresh process
# (scripts/gpu/profile_step.py). OUT gets profile-summary.txt (each run's header line and group
# shares) and profile-reports.tar.gz: one report per run (WORKLOAD-MODE-REP.txt) and each run's
# output (WORKLOAD-MODE-REP-stdout.txt), in one file because the device tool brings back few files.
# Environment: OUT (required), BUILD (default .gpu/build), PROFILE_REPS, PROFILE_DEADLINE_S
# (default 240: no run starts later).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT to the directory for the reports}"
reps=${PROFILE_REPS:-2}
deadline=${PROFILE_DEADLINE_S:-240}
case "$reps" in ''|*[!0-9]*|0) echo "profile.sh: PROFILE_REPS=$reps: give a count of 1 or more" >&2; exit 2 ;; esac
case "$deadline" in ''|*[!0-9]*) echo "profile.sh: PROFILE_DEADLINE_S=$deadline: give seconds" >&2; exit 2 ;; esac
sampler=$BUILD/bench/libgpumem_sampler.so
lib=$BUILD/torch/libgpumem_torch.so
[ -f "$sampler" ] || { echo "profile.sh: no $sampler (build the gpumem_sampler target and stage the build)" >&2; exit 2; }
[ -f "$lib" ] || { echo "profile.sh: no $lib (a torch build, staged)" >&2; exit 2; }
mkdir -p "$OUT/reports"
summary=$OUT/profile-summary.txt
trap 'tar czf "$OUT/profile-reports.tar.gz" -C "$OUT" reports && rm -rf "$OUT/reports"' EXIT
: >"$summary"
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(torch_alloc_pairs engine_pairs_threads alloc_loop gpt2_generate)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF GPUMEM_ALLOC_CONF
start=$SECONDS
status=0

groups_of() {  # the group shares of a report on one line: "name pct; name pct; ..."
  sed -n '/^groups/,/^$/p' "$1" | grep '%' |
    sed -E 's/^ *[0-9]+ +([0-9.]+%) +(.*[^ ]) +\(.*$/\2 \1/' | paste -sd';' | sed 's/;/; /g'
}

for w in "${workloads[@]}"; do
  if [ $((SECONDS - start)) -ge "$deadline" ]; then
    echo "== $w: not started (deadline ${deadline}s passed)" | tee -a "$summary"; status=1; continue
  fi
  if [ "$w" = engine_pairs_threads ]; then
    bin=$BUILD/bench/bench_alloc_pairs
    [ -x "$bin" ] || { echo "== $w: no $bin" | tee -a "$summary"; status=1; continue; }
    rep=$OUT/reports/engine_pairs_threads.txt
    echo "== bench_alloc_pairs --ops 100000 --threads 4 --rounds 3 --pattern window, sampled whole" | tee -a "$summary"
    GPUMEM_SAMPLER_OUT=$rep timeout 120 env LD_PRELOAD="$sampler" "$bin" --ops 100000 --threads 4 --rounds 3 \
      --pattern window >"$OUT/reports/engine_pairs_threads-stdout.txt" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { echo "   exit $rc (see engine_pairs_threads-stdout.txt)" | tee -a "$summary"; status=1; }
    [ -f "$rep" ] && { head -1 "$rep"; echo "   $(groups_of "$rep")"; cat "$OUT/reports/engine_pairs_threads-stdout.txt"; } | tee -a "$summary"
    continue
  fi
  if [ "$w" = torch_alloc_pairs ] || [ "$w" = torch_pairs_arenas ]; then
    bin=$BUILD/bench/torch_alloc_pairs
    [ -x "$bin" ] || { echo "== $w: no $bin" | tee -a "$summary"; status=1; continue; }
    rep=$OUT/reports/$w.txt
    extra=()
    # torch_pairs_arenas: gpumem alone (--gpumem-only) with arenas:4 on the windows, where four
    # threads pay each arena's driver calls (docs/notes/thread-caches.md, "What the arenas cost
    # through the driver").
    [ "$w" = torch_pairs_arenas ] && extra=(--gpumem-only --config arenas:4 --pattern window)
    echo "== torch_alloc_pairs --ops 200000 --thread-ops 20000 --threads 4 --rounds 3 ${extra[*]}, sampled whole" | tee -a "$summary"
    # LD_PRELOAD on the program alone: an armed ITIMER_PROF survives exec, so a wrapper (timeout)
    # that carried the sampler would be killed by SIGPROF in the exec'd image.
    GPUMEM_SAMPLER_OUT=$rep timeout 120 env LD_PRELOAD="$sampler" "$bin" --ops 200000 --thread-ops 20000 \
      --threads 4 --rounds 3 "${extra[@]}" >"$OUT/reports/$w-stdout.txt" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { echo "   exit $rc (see $w-stdout.txt)" | tee -a "$summary"; status=1; }
    [ -f "$rep" ] && { head -1 "$rep"; echo "   $(groups_of "$rep")"; } | tee -a "$summary"
    [ "$w" = torch_pairs_arenas ] && cat "$OUT/reports/$w-stdout.txt" | tee -a "$summary"
    continue
  fi
  for r in $(seq 1 "$reps"); do
    order=(native gpumem)
    [ $((r % 2)) -eq 0 ] && order=(gpumem native)
    for m in "${order[@]}"; do
      if [ $((SECONDS - start)) -ge "$deadline" ]; then
        echo "== $w $m rep $r: not started (deadline ${deadline}s passed)" | tee -a "$summary"; status=1; continue
      fi
      rep=$OUT/reports/$w-$m-$r.txt
      echo "== $w under $m, repetition $r" | tee -a "$summary"
      timeout 150 "$PY" scripts/gpu/profile_step.py --workload "$w" --mode "$m" --lib "$lib" \
        --sampler "$sampler" --out "$rep" >"$OUT/reports/$w-$m-$r-stdout.txt" 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then
        echo "   exit $rc:" | tee -a "$summary"; tail -5 "$OUT/reports/$w-$m-$r-stdout.txt" | tee -a "$summary"; status=1; continue
      fi
      { head -1 "$rep"; echo "   $(groups_of "$rep")"; } | tee -a "$summary"
    done
  done
done
echo "profile.sh: done in $((SECONDS - start)) s, status $status" | tee -a "$summary"
exit $status
