# Whether convnext_tiny_train's first losses move from process to process: native, gpumem's default
# and step_plan:True, two fresh processes each, 8 steps (callB's plan run read a loss different from
# native's at step 1, where the planner places nothing).
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=200 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads convnext_tiny_train --steps convnext_tiny_train=8 --warmup convnext_tiny_train=2 \
  --modes native,gpumem,plan --mode-conf plan=step_plan:True --reps 2 --run-timeout-s 90 2>&1 | tail -12
tar xzf $OUT/live/live-logs.tar.gz -C $OUT/live && grep -H -E '^step [1-3]/' $OUT/live/live-logs/*.log
date -u
