set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
export LD_LIBRARY_PATH=.gpu/build/lib:${LD_LIBRARY_PATH:-}
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E 'Model name'
date -u
for i in 1 2 3; do
  echo "== main run $i"
  taskset -c 2-3 .gpu/build/bench/bpc_main --pairs 2000000 --rounds 3 --config "" --config arenas:1,thread_cache:False
  echo "== new run $i"
  taskset -c 2-3 .gpu/build/bench/bpc_new --pairs 2000000 --rounds 3 --config "" --config arenas:1 --config arenas:1,thread_cache:False
done
date -u
} 2>&1 | tee $OUT/producer-consumer.txt
