set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
B=.gpu/build/bench/bench_alloc_pairs
T=.gpu/build/bench/torch_alloc_pairs
for i in 1 2 3; do
  timeout 60 $B --ops 100000 --threads 8 --rounds 3 >> $OUT/engine8-auto.txt 2>&1
  timeout 60 $B --ops 100000 --threads 8 --rounds 3 --config arenas:1 >> $OUT/engine8-one.txt 2>&1
  timeout 60 $B --ops 150000 --threads 4 --rounds 3 >> $OUT/engine4-auto.txt 2>&1
  timeout 60 $B --ops 150000 --threads 4 --rounds 3 --config arenas:1 >> $OUT/engine4-one.txt 2>&1
  echo "engine alt $i done at $SECONDS s"
done
for i in 1 2 3; do
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 8 --rounds 3 >> $OUT/torch8-auto.txt 2>&1
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 8 --rounds 3 --config arenas:1 >> $OUT/torch8-one.txt 2>&1
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 4 --rounds 3 >> $OUT/torch4-auto.txt 2>&1
  timeout 100 $T --gpumem-only --ops 100000 --thread-ops 20000 --threads 4 --rounds 3 --config arenas:1 >> $OUT/torch4-one.txt 2>&1
  echo "torch alt $i done at $SECONDS s"
done
for f in engine8-auto engine8-one engine4-auto engine4-one; do echo "== $f"; grep -E "^(4 KiB|1 MiB|64 MiB|window)" $OUT/$f.txt | awk '{print $1,$2,$(NF-0)}' | head -0; grep -E "^(4 KiB|1 MiB|64 MiB|window)" $OUT/$f.txt | cut -c1-75; done
for f in torch8-auto torch8-one torch4-auto torch4-one; do echo "== $f"; grep -E "^(4 KiB|1 MiB|64 MiB|window)" $OUT/$f.txt | cut -c1-100; grep -o "engines [0-9]*.*peak reserved [0-9]* MiB" $OUT/$f.txt; done
date -u
