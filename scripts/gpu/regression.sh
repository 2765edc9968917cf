#!/usr/bin/env bash
# GPU regression checks of what already worked (binaries from scripts/gpu/stage.sh; nothing is
# compiled here): the MemorySource conformance suite's [gpu] cases, the CUDA VMM call costs and what
# the driver answers for parts of a handle (cuda_vmm_groups), the
# torch adapter's C++ tests, identical losses native vs gpumem (train_transformer, deterministic),
# and every Python install path (examples/python_swap.py). About 60 s.
#
#   OUT=/dir scripts/gpu/regression.sh      ($OUT gets regression-summary.txt, regression-logs.tar.gz)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
: "${OUT:?set OUT}"
logs=$OUT/regression-logs
mkdir -p "$logs"
summary=$OUT/regression-summary.txt
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
trap 'tar czf "$OUT/regression-logs.tar.gz" -C "$OUT" regression-logs && rm -rf "$logs"' EXIT

run_catch() {  # name binary [args...]
  local name=$1 bin=$2; shift 2
  if [ ! -x "$bin" ]; then note "$name: MISSING ($bin)"; status=1; return; fi
  if timeout 120 "$bin" "$@" >"$logs/$name.log" 2>&1; then
    note "$name: passed ($(grep -E 'All tests passed|test cases' "$logs/$name.log" | tail -1))"
  else
    note "$name: FAILED (exit $?; see $name.log)"; tail -25 "$logs/$name.log"; status=1
  fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
run_catch conformance_gpu "$BUILD/tests/allocator/test_memory_source" "[gpu]"
for t in torch_cuda_allocator torch_cuda_sim torch_adapter_parts; do
  run_catch "$t" "$BUILD/tests/torch/$t" --order lex
done
if timeout 60 "$BUILD/bench/cuda_vmm_calls" >"$logs/cuda_vmm_calls.log" 2>&1; then
  note "cuda_vmm_calls:"; tail -12 "$logs/cuda_vmm_calls.log" | tee -a "$summary"
else
  note "cuda_vmm_calls: FAILED"; status=1
fi
if timeout 120 "$BUILD/bench/cuda_vmm_groups" >"$logs/cuda_vmm_groups.log" 2>&1; then
  note "cuda_vmm_groups:"; tail -16 "$logs/cuda_vmm_groups.log" | tee -a "$summary"
else
  note "cuda_vmm_groups: FAILED"; tail -5 "$logs/cuda_vmm_groups.log" | tee -a "$summary"; status=1
fi

tt=$BUILD/examples/train_transformer
det=(--device cuda --steps 12 --batch 8 --min-seq 32 --max-seq 256 --deterministic --seed 3)
timeout 90 "$tt" --allocator native "${det[@]}" >"$logs/train_det_native.log" 2>&1
timeout 90 "$tt" --allocator gpumem "${det[@]}" >"$logs/train_det_gpumem.log" 2>&1
if diff <(grep -oE 'loss [^ ]+' "$logs/train_det_native.log") <(grep -oE 'loss [^ ]+' "$logs/train_det_gpumem.log") \
     >"$logs/train_det_diff.log" && [ "$(grep -c '^step' "$logs/train_det_gpumem.log")" -eq 12 ]; then
  note "train_transformer deterministic: 12 losses identical (native vs gpumem)"
else
  note "train_transformer deterministic: losses DIFFER or a run failed (train_det_*.log)"; status=1
fi

lib=$BUILD/torch/libgpumem_torch.so
if PYTHONUNBUFFERED=1 timeout 150 "$PY" examples/python_swap.py --lib "$lib" --mode all --out "$logs" \
     >"$logs/python_swap.log" 2>&1; then
  note "python_swap: $(tail -1 "$logs/python_swap.log")"
else
  note "python_swap: FAILED ($(grep -E '^FAIL|python_swap:' "$logs/python_swap.log" | tr '\n' ' '))"; status=1
fi
note "regression: $([ $status = 0 ] && echo PASSED || echo FAILED)"
exit $status
