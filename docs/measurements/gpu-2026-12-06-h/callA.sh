# Session 37 (main head after b05c0f4): GPT-2 varlen training's step time with eight alternated
# repetitions of PyTorch's allocator, expandable segments, gpumem's default and step_plan:False;
# the two Llama workloads with four (whole runs, warm-up steps included, for the driver time a run
# pays once); then issue 13's per-call rows (the engine alone, and torch_alloc_pairs) with and
# without the planner, three alternated fresh processes each. Each live run is a fresh process
# (scripts/gpu/live.sh). Binaries built on the CPU machine, carried as .gpu/build.tar.xz.
# Run from the repository root with OUT set.
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E 'Model name|^CPU\(s\)'
date -u
LIVE_DEADLINE_S=200 OUT=$OUT/varlen scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads gpt2_varlen_train --modes native,expandable,gpumem,noplan --mode-conf noplan=step_plan:False \
  --reps 8 2>&1 | tail -30
date -u
LIVE_DEADLINE_S=130 OUT=$OUT/llama scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads llama_train,llama_train_ckpt --modes native,expandable,gpumem --reps 4 2>&1 | tail -30
date -u
for i in 1 2 3; do
  for v in default noplan; do
    conf=(); [ $v = noplan ] && conf=(--config step_plan:False)
    echo "== engine 1 thread, $v, run $i"
    taskset -c 2 $BUILD/bench/bench_alloc_pairs --ops 150000 --threads 0 --rounds 3 "${conf[@]}" 2>&1 |
      grep -E '^(4 KiB|1 MiB|64 MiB|window)' | cut -c1-200
    echo "== torch_alloc_pairs, $v, run $i"
    taskset -c 2-5 timeout 120 $BUILD/bench/torch_alloc_pairs --ops 200000 --thread-ops 20000 --threads 4 --rounds 3 "${conf[@]}" 2>&1 | tail -25
  done
done
date -u
