#!/usr/bin/env bash
# The corpus of real workloads (issue 12), one group per GPU call: every workload of the group
# (run_corpus.py's GROUPS) captured twice under PyTorch's own CUDA caching allocator (default
# settings, then PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), each in a fresh process,
# several side by side where their memory fits, all within CORPUS_DEADLINE_S (default 420 s) plus
# packing: under 8 minutes on one H200 for `tuned`, under 2 for `held_out`.
#
#   OUT=/results bash scripts/gpu/corpus/capture_all.sh --only tuned|held_out|held_out_b|held_out_c [run_corpus.py options]
#
# Without --only it tries every workload, which is more than one deadline holds.
#
# Environment: OUT (required); BIN_DIR (default .gpu/bin: checkpoint_llama, zero_train and the
# shared libraries they need, built on the CPU machine against torch 2.11 cu130; the two C++
# workloads print SKIPPED without them); CORPUS_WORK (scratch, default /tmp/gpumem-corpus);
# CORPUS_DEADLINE_S; PYTHON (default python3).
#
# OUT receives corpus-traces-N.tar (traces/corpus/MODE/NAME.trace.csv.gz + .json: untar in the
# repository root), corpus-logs.tar.gz (logs, traces/corpus/MANIFEST.md/.json, summary) and
# MANIFEST.md. The summary table is printed last.
set -uo pipefail
: "${OUT:?set OUT to the directory for results}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$root"
here=scripts/gpu/corpus
python=${PYTHON:-python3}
bin_dir=${BIN_DIR:-$root/.gpu/bin}
work=${CORPUS_WORK:-/tmp/gpumem-corpus}
deadline=${CORPUS_DEADLINE_S:-420}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PYTORCH_CUDA_ALLOC_CONF  # capture.py sets it per mode
mkdir -p "$OUT"
rm -rf "$work"
mkdir -p "$work/logs"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1
  timeout 60 "$python" -c 'import sys, torch, transformers, torchvision
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "torchvision", torchvision.__version__)' 2>&1
} > "$work/logs/machine.txt"
cat "$work/logs/machine.txt"

bin_args=()
if [ -d "$bin_dir" ]; then
  bin_args=(--bin-dir "$bin_dir")
  lib_path=$("$python" "$here/capture.py" --print-library-path --bin-dir "$bin_dir")
  echo "C++ examples run with LD_LIBRARY_PATH=$lib_path" >> "$work/logs/machine.txt"
  for b in checkpoint_llama zero_train; do
    [ -x "$bin_dir/$b" ] || continue
    missing=$(LD_LIBRARY_PATH="$lib_path" ldd "$bin_dir/$b" 2>&1 | grep "not found" || true)
    [ -z "$missing" ] || echo "WARNING: $b misses shared libraries (carry them in $bin_dir): $missing" \
      | tee -a "$work/logs/machine.txt"
  done
else
  echo "no binary directory $bin_dir: the C++ workloads will be SKIPPED" | tee -a "$work/logs/machine.txt"
fi

timeout --kill-after=15 $((deadline + 30)) "$python" "$here/run_corpus.py" --out "$OUT" --work "$work" \
  --deadline-s "$deadline" --python "$python" "${bin_args[@]}" "$@"
rc=$?
if [ $rc -ge 124 ]; then
  # run_corpus.py itself was stopped: what finished is already in $OUT; print what it left.
  echo "run_corpus.py was stopped (exit $rc)"
  cat "$work/logs/summary.txt" 2>/dev/null
fi

exit $rc
