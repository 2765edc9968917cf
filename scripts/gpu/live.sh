#!/usr/bin/env bash
# The live side-by-side measurement of issues 12, 13 and 14 in one GPU call (about 6.5 minutes on
# one H200): PyTorch's allocator, expandable segments and gpumem on GPT-2 varlen training, the
# Llama-style model with and without checkpointing and GPT-2 generate(), three alternated
# repetitions, each run a fresh process (scripts/gpu/live/live.py; its docstring says what it
# measures). Compiles nothing: it uses a libgpumem_torch.so built on the CPU machine and carried.
#
#   OUT=/results scripts/gpu/live.sh [PATH/libgpumem_torch.so] [live.py options]
#
# The library: the first argument if it ends in .so, else the first of .gpu/build/torch/,
# .gpu/build/allocator/torch/, .gpu/bin/, build-gpu/torch/, build-gpu/allocator/torch/. Its
# directory goes on LD_LIBRARY_PATH (a libfmt.so.9 carried beside it is found there).
# Environment: OUT (required), PYTHON (default python3), LIVE_DEADLINE_S (default 380: no run
# starts later; the call ends by about deadline + 60 s).
#
# OUT receives live.jsonl (one line per run), summary.txt (the table), summary.json (its rows, in
# bytes) and live-logs.tar.gz (each run's log, machine.txt). The table prints last.
set -uo pipefail
: "${OUT:?set OUT to the directory for results}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
python=${PYTHON:-python3}
deadline=${LIVE_DEADLINE_S:-380}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF GPUMEM_ALLOC_CONF  # live.py sets them per run
mkdir -p "$OUT"

lib=
if [ $# -gt 0 ] && [[ "$1" == *.so ]]; then
  lib=$1
  shift
  [ -f "$lib" ] || { echo "live.sh: $lib does not exist (build libgpumem_torch.so on the CPU machine and carry it)" >&2; exit 2; }
else
  for d in .gpu/build/torch .gpu/build/allocator/torch .gpu/bin build-gpu/torch build-gpu/allocator/torch; do
    if [ -f "$d/libgpumem_torch.so" ]; then lib=$d/libgpumem_torch.so; break; fi
  done
fi
lib_args=()
if [ -n "$lib" ]; then
  lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
  export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  lib_args=(--lib "$lib")
fi

work=$(mktemp -d /tmp/gpumem-live-XXXXXX)
{
  date -u
  timeout 20 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
  echo "libgpumem_torch.so: ${lib:-none found}"
  [ -z "$lib" ] || ls -la "$lib"
  [ -z "$lib" ] || ldd "$lib" 2>&1 | grep fmt || true
} > "$work/machine.txt"
cat "$work/machine.txt"

timeout --kill-after=15 $((deadline + 90)) "$python" scripts/gpu/live/live.py --out "$OUT" --work "$work" \
  --deadline-s "$deadline" "${lib_args[@]}" "$@"
rc=$?
if [ $rc -ge 124 ]; then
  echo "live.sh: live.py was stopped by its outer timeout ($((deadline + 90)) s); partial results in $OUT"
  tar czf "$OUT/live-logs.tar.gz" -C "$(dirname "$work")" "$(basename "$work")" 2>/dev/null
  cat "$OUT/summary.txt" 2>/dev/null
fi
exit $rc
