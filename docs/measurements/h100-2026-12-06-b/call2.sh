set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
export LD_LIBRARY_PATH=.gpu/build/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep 'Model name'
date -u
for i in 1 2 3 4 5 6; do
  for b in main pgo; do
    echo -n "$b "
    taskset -c 2 .gpu/build/bench/bap_$b --ops 150000 --threads 0 --rounds 3 | grep -E '^(4 KiB|1 MiB|64 MiB|window)' | sed -E 's/^(4 KiB pairs|1 MiB pairs|64 MiB pairs|window 64, 512 B-32 MiB|window 1024, 512 B-32 MiB) +([0-9.]+).*/\2/' | tr '\n' ' '
    echo
  done
done | tee $OUT/pgo-ab.txt
date -u
