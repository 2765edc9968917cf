set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
FINAL=$OUT
OUT=/tmp/s30live LIVE_DEADLINE_S=240 scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so > /tmp/s30live.stdout 2>&1
echo "live rc=$?"
cp /tmp/s30live/summary.txt /tmp/s30live/live.jsonl /tmp/s30live/summary.json $FINAL/ 2>/dev/null
cp /tmp/s30live/live-logs.tar.gz $FINAL/ 2>/dev/null
tail -5 /tmp/s30live.stdout
date -u
