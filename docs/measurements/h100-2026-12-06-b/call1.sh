set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
W=/tmp/s33c; rm -rf $W; mkdir -p $W
args=(--ops 200000 --thread-ops 2000 --threads 4 --rounds 3)
for i in 1 2 3 4; do
  OUT=$W/d$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" > /dev/null 2>&1
  OUT=$W/p$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" --config step_plan:True > /dev/null 2>&1
  echo "alt $i done at $SECONDS s"
done
for m in d p; do
  cat $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log $W/${m}4/run-1.log > $OUT/pairs-$m-logs.txt
  python3 scripts/gpu/torch_pairs_summary.py $W/${m}1/run-1.log $W/${m}2/run-1.log $W/${m}3/run-1.log $W/${m}4/run-1.log > $OUT/pairs-$m-summary.txt 2>&1
  echo "== $m"; cat $OUT/pairs-$m-summary.txt
done
for m in d p; do echo "== $m per process (native 1t / gpumem 1t, 4 KiB and window 64)"; grep -E '^(4 KiB|window 64)' $OUT/pairs-$m-logs.txt | awk '{print $1,$2,$3,$4,$5,$6,$7}' ; done
B=.gpu/build/bench/bench_alloc_pairs
for i in 1 2 3 4; do
  timeout 60 taskset -c 2 $B --ops 150000 --threads 0 --rounds 3 >> $OUT/engine-d.txt 2>&1
  timeout 60 taskset -c 2 $B --ops 150000 --threads 0 --rounds 3 --config step_plan:True >> $OUT/engine-p.txt 2>&1
  echo "engine alt $i done at $SECONDS s"
done
for m in d p; do echo "== engine $m"; grep -E '^(4 KiB|1 MiB|64 MiB|window)' $OUT/engine-$m.txt | cut -c1-70; done
date -u
