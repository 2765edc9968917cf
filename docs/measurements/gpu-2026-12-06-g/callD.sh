# Held-out workloads with the step planner as gpumem's default (main a2309e4): peak reserved under
# expandable segments, gpumem's default and step_plan:False, one fresh process each, on two
# workloads the policy was not tuned on: a fixed-shape training where the planner may plan, and
# a beam search where the replay put it 0.3% higher (scripts/gpu/live.sh).
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
LIVE_DEADLINE_S=200 OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so \
  --workloads bert_large_mlm_train,t5_beam_generate \
  --modes expandable,gpumem,noplan --mode-conf noplan=step_plan:False --reps 1 2>&1 | tail -30
date -u
