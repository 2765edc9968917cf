# A long live run with the step planner as gpumem's default (main a2309e4): convnext_tiny_train for
# 300 steps (5 of warm-up) under PyTorch's allocator, expandable segments and gpumem's default, one
# fresh process each (scripts/gpu/live.sh). Session 35 measured gpumem's old default here at 7.910 GiB
# against expandable segments' 7.844 (docs/measurements/gpu-2026-12-06-e/).
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=330 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads convnext_tiny_train --steps convnext_tiny_train=300 --warmup convnext_tiny_train=5 \
  --modes native,expandable,gpumem --reps 1 --run-timeout-s 150 2>&1 | tail -30
date -u
