# Issue 12's four live workloads with the step planner as gpumem's default (main a2309e4): PyTorch's
# allocator, expandable segments, gpumem's default and gpumem with step_plan:False (the default
# before), three alternated repetitions, each run a fresh process (scripts/gpu/live.sh).
# Binaries built on the CPU machine, carried as .gpu/build.tar.xz. Run from the repository root, OUT set.
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=500 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --modes native,expandable,gpumem,noplan --mode-conf noplan=step_plan:False --reps 3 2>&1 | tail -40
date -u
