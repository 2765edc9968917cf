set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name --format=csv,noheader
args=(--ops 200000 --thread-ops 20000 --threads 4 --rounds 3)
for i in 1 2 3; do
  OUT=$OUT/tp/d$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" > $OUT/tp-d$i.txt 2>&1
  OUT=$OUT/tp/c$i TORCH_PAIRS_DEADLINE_S=100 scripts/gpu/torch_pairs_reps.sh 1 -- "${args[@]}" --config recycle_churn:0.3 > $OUT/tp-c$i.txt 2>&1
  echo "alt $i done at $SECONDS s"
done
for m in d c; do python3 scripts/gpu/torch_pairs_summary.py $OUT/tp/${m}1/run-1.log $OUT/tp/${m}2/run-1.log $OUT/tp/${m}3/run-1.log > $OUT/tp-$m-summary.txt 2>&1; echo "== $m"; cat $OUT/tp-$m-summary.txt; done
LIVE_DEADLINE_S=$((500 - SECONDS)) OUT=$OUT/live scripts/gpu/live.sh .gpu/build/torch/libgpumem_torch.so --workloads llama_train,gpt2_generate,gpt2_varlen_train,llama_train_ckpt --modes expandable,gpumem,churn --mode-conf churn=recycle_churn:0.3 --reps 3 2>&1 | tail -40
