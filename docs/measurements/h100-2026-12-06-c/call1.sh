set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
export LD_LIBRARY_PATH=.gpu/build/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E 'Model name|^CPU\(s\)'
date -u
for i in 1 2 3 4 5; do
  for v in main new main:thread_cache:False; do
    b=${v%%:*}; conf=""; [ "$v" != "$b" ] && conf="--config ${v#*:}"
    for t in 4 8; do
      [ "$v" = main:thread_cache:False ] && [ $t = 8 ] && continue
      cpus=2-5; [ $t = 8 ] && cpus=2-9
      echo "== $v threads $t run $i"
      taskset -c $cpus .gpu/build/bench/bap_$b --ops 150000 --threads $t --rounds 3 --pattern "4 KiB" --pattern "window 64" --pattern "window 1024" $conf 2>&1 | grep -E '^(4 KiB|window)' | cut -c1-300
    done
  done
done | tee $OUT/caches-help.txt
date -u
