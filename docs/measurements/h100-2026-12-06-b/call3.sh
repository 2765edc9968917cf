set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
export LD_LIBRARY_PATH=.gpu/build/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
B=.gpu/build/bench/bench_alloc_pairs
for i in 1 2 3 4; do
  for c in "" "thread_cache:False" "arenas:4,thread_cache:False"; do
    echo "== config '${c:-default}' run $i"
    taskset -c 2-5 $B --ops 150000 --threads 4 --rounds 3 --pattern "4 KiB" --pattern "window 64" --pattern "window 1024" ${c:+--config $c} 2>&1 | grep -E '^(4 KiB|window)' | cut -c1-200
  done
done | tee $OUT/arena-caches.txt
date -u
