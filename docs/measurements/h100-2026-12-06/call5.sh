set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
FINAL=$OUT
W=/tmp/s31c; rm -rf $W; mkdir -p $W
args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
for i in 1 2 3; do
  OUT=$W/d$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" > /dev/null 2>&1
  OUT=$W/o$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" --config arenas:1 > /dev/null 2>&1
  echo "alt $i done at $SECONDS s"
done
for m in d o; do
  cat $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log > $FINAL/pairs-$m-logs.txt
  python3 scripts/gpu/torch_pairs_summary.py $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log > $FINAL/pairs-$m-summary.txt 2>&1
  echo "== $m"; cat $FINAL/pairs-$m-summary.txt
done
OUT=/tmp/s31live2 LIVE_DEADLINE_S=330 scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so --modes native,expandable,gpumem --reps 3 > /tmp/s31live2.stdout 2>&1
echo "live rc=$?"
cp /tmp/s31live2/summary.txt /tmp/s31live2/live.jsonl $FINAL/ 2>/dev/null
grep -A9 "^targets" /tmp/s31live2/summary.txt
grep -A8 "did not finish" /tmp/s31live2/summary.txt | head -8
date -u
