set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
FINAL=$OUT
OUT=/tmp/s33live LIVE_DEADLINE_S=540 scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so --mode-conf plan=step_plan:True --modes native,expandable,gpumem,plan --reps 3 > /tmp/s33live.stdout 2>&1
echo "live rc=$?"
cp /tmp/s33live/summary.txt /tmp/s33live/live.jsonl /tmp/s33live/summary.json /tmp/s33live/live-logs.tar.gz $FINAL/ 2>/dev/null
cp /tmp/s33live.stdout $FINAL/live.stdout 2>/dev/null
grep -A14 "^targets" /tmp/s33live/summary.txt
grep -A30 "did not finish" /tmp/s33live/summary.txt | head -12
date -u
