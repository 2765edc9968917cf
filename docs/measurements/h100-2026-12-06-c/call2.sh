set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E 'Model name'
date -u
base_ld=$LD_LIBRARY_PATH
for i in 1 2 3 4; do
  for v in main new; do
    echo "== $v run $i"
    LD_LIBRARY_PATH=.gpu/build/tb_$v:$base_ld timeout 120 taskset -c 2-5 .gpu/build/tb_$v/torch_alloc_pairs --ops 200000 --thread-ops 20000 --threads 4 --rounds 3 2>&1 | grep -vE '^\s*$' | cut -c1-300
  done
done | tee $OUT/torch-pairs.txt
date -u
