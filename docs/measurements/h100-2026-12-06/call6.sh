set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
B=.gpu/build/bench/bench_alloc_pairs
T=.gpu/build/bench/torch_alloc_pairs
for i in 1 2 3; do
  timeout 60 $B --ops 100000 --threads 8 --rounds 3 >> $OUT/engine8-auto.txt 2>&1
  timeout 60 $B --ops 100000 --threads 8 --rounds 3 --config arenas:1 >> $OUT/engine8-one.txt 2>&1
  echo "engine alt $i done at $SECONDS s"
done
for i in 1 2 3; do
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 8 --rounds 3 >> $OUT/torch8-auto.txt 2>&1
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 8 --rounds 3 --config arenas:1 >> $OUT/torch8-one.txt 2>&1
  echo "torch alt $i done at $SECONDS s"
done
for f in engine8-auto engine8-one torch8-auto torch8-one; do echo "== $f"; grep -E "pairs|window|engines" $OUT/$f.txt | cut -c1-110; done
date -u
