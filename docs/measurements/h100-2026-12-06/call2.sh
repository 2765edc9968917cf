set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
W=/tmp/s30a; rm -rf $W; mkdir -p $W
args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3 --pattern "window 64" --pattern "window 1024")
for i in 1 2 3; do
  OUT=$W/d$i TORCH_PAIRS_DEADLINE_S=40 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" > /dev/null 2>&1
  OUT=$W/a$i TORCH_PAIRS_DEADLINE_S=40 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" --config arenas:4 > /dev/null 2>&1
  echo "alt $i done at $SECONDS s"
done
for m in d a; do
  cat $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log > $OUT/$m-logs.txt
  python3 scripts/gpu/torch_pairs_summary.py $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log > $OUT/$m-summary.txt 2>&1
  echo "== $m"; cat $OUT/$m-summary.txt
done
date -u
