set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
export LD_LIBRARY_PATH=.gpu/build/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u
for i in 1 2 3; do
  for b in main new; do
    for t in 4 8; do
      cpus=2-5; [ $t = 8 ] && cpus=2-9
      echo "== $b threads $t run $i"
      taskset -c $cpus .gpu/build/bench/bap_$b --ops 150000 --threads $t --rounds 3 --pattern "4 KiB" --pattern "window 64" --pattern "window 1024" 2>&1 | grep -E '^(4 KiB|window)' | cut -c1-260
    done
  done
done | tee $OUT/caches-wait.txt
date -u
