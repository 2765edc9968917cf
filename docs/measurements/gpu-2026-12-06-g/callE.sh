# More held-out workloads (the third held-out set's first three), as callD.sh: peak reserved under
# expandable segments, gpumem's default and step_plan:False, one fresh process each.
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=200 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads clip_contrastive_train,r3d18_video_train,wav2vec2_ctc_varlen_train \
  --modes expandable,gpumem,noplan --mode-conf noplan=step_plan:False --reps 1 2>&1 | tail -30
date -u
