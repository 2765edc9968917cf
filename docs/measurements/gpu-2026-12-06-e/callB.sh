# A long live run: convnext_tiny_train for 300 steps (5 of warm-up) under PyTorch's allocator,
# expandable segments, gpumem's default and gpumem with step_plan:True, one fresh process each
# (scripts/gpu/live.sh). Replayed, the default's peak creeps past expandable segments' over such a
# run and the step planner's does not (docs/notes/allocation-policy.md, "Long runs: the creep").
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=420 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads convnext_tiny_train --steps convnext_tiny_train=300 --warmup convnext_tiny_train=5 \
  --modes native,expandable,gpumem,plan --mode-conf plan=step_plan:True --reps 1 --run-timeout-s 150 2>&1 | tail -30
date -u
