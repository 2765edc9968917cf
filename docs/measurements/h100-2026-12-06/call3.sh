set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
FINAL=$OUT
OUT=/tmp/s31live LIVE_DEADLINE_S=430 scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so --modes native,expandable,gpumem --reps 3 > /tmp/s31live.stdout 2>&1
echo "live rc=$?"
cp /tmp/s31live/summary.txt /tmp/s31live/live.jsonl /tmp/s31live/summary.json /tmp/s31live/live-logs.tar.gz $FINAL/ 2>/dev/null
grep -A12 "^targets" /tmp/s31live/summary.txt
grep -A30 "did not finish" /tmp/s31live/summary.txt | head -12
date -u
