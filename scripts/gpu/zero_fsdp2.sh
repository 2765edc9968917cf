#!/usr/bin/env bash
# gpumem::zero against PyTorch's FSDP2 (issue 18), on N GPUs of one host, one process per GPU,
# every program launched by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
# TORCHELASTIC_USE_AGENT_STORE):
#
#   * examples/zero_train at ZeRO stages 0 (plain all-reduce data parallelism), 1, 2 and 3;
#   * scripts/gpu/zero_fsdp2.py, the same model and data in Python: FSDP2 (fully_shard,
#     reshard after forward), FSDP2 keeping parameters gathered, and DDP;
#
# each with gpumem and with PyTorch's allocator, after the [gpu] trainer test
# (BUILD/tests/checkpointing/zero_trainer_test: ProcessGroupNCCL, side-stream prefetch). Every
# rank reports peak reserved and allocated bytes, step time and the global batch's loss;
# zero_train also its model-state bytes against the ZeRO formulas. The summary (last) puts them side by side and checks issue 18's targets: stage 2
# within 5% of stage 0's step time, stage 3 within 15%, and the loss of every stage equal to
# stage 0's (the same global batch).
#
#   OUT=/tmp/zf scripts/gpu/zero_fsdp2.sh        # all visible GPUs (2 or more for the comparison)
#   OUT=/tmp/zf NGPU=1 scripts/gpu/zero_fsdp2.sh # smoke run on one GPU: a small model and the
#                                                #   runs that prove each path (about 2 minutes)
#
# Nothing is compiled here: the binaries come from BUILD (default .gpu/build, a build tree made
# on the build machine: BUILD/examples/zero_train, BUILD/torch/libgpumem_torch.so).
# LD_LIBRARY_PATH gets the torch wheel's library directories (scripts/gpu/corpus/capture.py
# --print-library-path, when present) and BUILD/lib.
# Environment: NGPU (default: every visible GPU), STEPS, RUNS (which runs, e.g.
# "zero_stage0_native fsdp2_gpumem"; default: all for NGPU >= 2, a smoke set for NGPU = 1),
# PYTHON (python3). DEVICE=cpu checks the script itself on any machine: NGPU processes over Gloo,
# a tiny model, no memory numbers (c10's CPU allocator keeps none).
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1) for every program started here.
# $OUT: zero_fsdp2-summary.txt (the table and verdicts) and zero_fsdp2-logs.tar.gz (each run's
# log, results.txt with every RESULT line). Exit status 0 when every run succeeded.
set -uo pipefail
: "${OUT:?set OUT to the directory for results}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
py=${PYTHON:-python3}
build=${BUILD:-.gpu/build}
summary=$OUT/zero_fsdp2-summary.txt
logs=$OUT/zero_fsdp2-logs
mkdir -p "$logs"
trap 'tar czf "$OUT/zero_fsdp2-logs.tar.gz" -C "$OUT" zero_fsdp2-logs 2>/dev/null && rm -rf "$logs"' EXIT
results=$logs/results.txt
: >"$results"
status=0

device=${DEVICE:-cuda}
if [ "$device" = cuda ]; then
  visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  ngpu=${NGPU:-$visible}
  if [ "$ngpu" -lt 1 ] || [ "$ngpu" -gt "$visible" ]; then
    echo "NGPU=$ngpu but $visible GPU(s) are visible" | tee "$summary"; exit 1
  fi
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >"$logs/gpus.txt" 2>&1
else
  ngpu=${NGPU:-2}
  export OMP_NUM_THREADS=1
fi

if [ "$device" = cpu ]; then  # the script's own check
  model=(--layers 2 --width 64 --heads 4 --seq 32 --vocab 64 --batch $((2 * ngpu)) --lr 6e-4)
  steps=${STEPS:-8}
elif [ "$ngpu" -ge 2 ]; then  # ~150 M parameters, 8 rows of 512 tokens per GPU
  model=(--layers 12 --width 1024 --heads 16 --seq 512 --vocab 256 --batch $((8 * ngpu)) --lr 6e-4)
  steps=${STEPS:-25}
else                        # smoke: ~13 M parameters
  model=(--layers 4 --width 512 --heads 8 --seq 256 --vocab 256 --batch 8 --lr 6e-4)
  steps=${STEPS:-12}
fi
warmup=$(( steps > 8 ? 5 : 2 ))

zero_train=$build/examples/zero_train
lib=$build/torch/libgpumem_torch.so
for f in "$zero_train" "$lib"; do
  if [ ! -f "$f" ]; then
    echo "$f is missing: build zero_train and gpumem_torch into BUILD=$build first" | tee "$summary"
    exit 1
  fi
done
libpath=$build/lib
if [ -f scripts/gpu/corpus/capture.py ]; then
  libpath=$("$py" scripts/gpu/corpus/capture.py --print-library-path 2>/dev/null):$libpath
fi
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ! timeout 60 "$zero_train" --help >"$logs/zero_train_help.txt" 2>&1; then
  echo "$zero_train does not start (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):" | tee "$summary"
  tail -5 "$logs/zero_train_help.txt" | tee -a "$summary"; exit 1
fi

if [ "$device" = cuda ]; then  # the [gpu] trainer test: ProcessGroupNCCL, side-stream prefetch
  echo "== [gpu] zero_trainer_test ($(date +%T))"
  if timeout 180 "$build/tests/checkpointing/zero_trainer_test" "[gpu]" -s \
       >"$logs/zero_trainer_test_gpu.log" 2>&1; then
    grep -E "CUDA stage" "$logs/zero_trainer_test_gpu.log" | sort -u | tee -a "$logs/gpu_test.txt"
  else
    status=1; echo "zero_trainer_test [gpu] FAILED:"; tail -20 "$logs/zero_trainer_test_gpu.log"
  fi
fi

if [ -n "${RUNS:-}" ]; then
  runs=" $RUNS "
elif [ "$device" = cuda ] && [ "$ngpu" -lt 2 ]; then  # smoke: every path once per allocator
  runs=" zero_stage0_native zero_stage3_native fsdp2_native ddp_native zero_stage0_gpumem"
  runs+=" zero_stage3_gpumem fsdp2_gpumem ddp_gpumem "
else
  runs=all
fi

launch() {  # launch NAME PROGRAM-AND-ARGS...: torchrun, one process per GPU, 240 s at most
  local name=$1; shift
  if [ "$runs" != all ] && [[ "$runs" != *" $name "* ]]; then return; fi
  echo "== $name ($(date +%T))"
  if timeout -k 10 240 "$py" -m torch.distributed.run --standalone --nproc-per-node "$ngpu" "$@" \
       >"$logs/$name.log" 2>&1; then
    grep '^RESULT' "$logs/$name.log" | sed "s/^RESULT /RESULT run=$name /" | tee -a "$results" | cut -c1-160
  else
    status=1
    echo "$name FAILED (exit $?):"; grep -v '^\[W' "$logs/$name.log" | tail -15
  fi
}

for alloc in native gpumem; do
  for stage in 0 1 2 3; do
    launch "zero_stage${stage}_$alloc" --no-python "$zero_train" --device "$device" --stage "$stage" \
      --allocator "$alloc" --steps "$steps" --log-every 10 "${model[@]}"
  done
  for mode in fsdp2 fsdp2_keep ddp; do
    if [ "$device" = cpu ] && [ "$alloc" = gpumem ]; then continue; fi  # gpumem: CUDA only
    launch "${mode}_$alloc" scripts/gpu/zero_fsdp2.py --mode "$mode" --allocator "$alloc" \
      --lib "$lib" --device "$device" --steps "$steps" --warmup "$warmup" "${model[@]}"
  done
done

if [ -f "$logs/gpu_test.txt" ]; then
  { echo "[gpu] zero_trainer_test (single GPU, ProcessGroupNCCL):"; cat "$logs/gpu_test.txt"; echo; } >"$summary"
else
  : >"$summary"
fi
"$py" - "$results" "$ngpu" "$device" <<'EOF' | tee -a "$summary"
import sys
from collections import defaultdict

path, ngpu, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = defaultdict(list)
for line in open(path):
    fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    runs[fields["run"]].append(fields)
def mib(b):
    return "n/a" if float(b) < 0 else f"{float(b) / 2**20:.1f}"  # CPU: no allocator statistics
where = f"{ngpu} GPU(s)" if device == "cuda" else f"{ngpu} CPU processes (a check of the script: no meaningful times)"
print(f"gpumem::zero vs FSDP2 on {where}, per rank (peak over training)")
print(f"{'run':<24}{'rank':>5}{'peak reserved MiB':>19}{'peak alloc MiB':>16}{'ms/step':>10}"
      f"{'loss first -> last':>22}{'states MiB (formula)':>24}")
for name in sorted(runs):
    for r in sorted(runs[name], key=lambda f: int(f.get("rank", 0))):
        states = ""
        if "state_bytes" in r:
            states = f"{mib(r['state_bytes'])} ({mib(r['formula_bytes'])})"
        print(f"{name:<24}{r.get('rank', '0'):>5}{mib(r.get('peak_reserved_bytes', -1)):>19}"
              f"{mib(r.get('peak_allocated_bytes', -1)):>16}{float(r['ms_per_step']):>10.2f}"
              f"{float(r['first_loss']):>11.4f} -> {float(r['last_loss']):.4f}{states:>24}")

def ms(name):  # the slowest rank's step time: the step ends when every rank's does
    return max(float(r["ms_per_step"]) for r in runs[name]) if runs.get(name) else None

print("\nissue 18 targets (step time against stage 0 = plain all-reduce, same allocator):")
for alloc in ("native", "gpumem"):
    base = ms(f"zero_stage0_{alloc}")
    if base is None:
        print(f"  {alloc}: stage 0 did not run"); continue
    for stage, limit in ((1, None), (2, 0.05), (3, 0.15)):
        t = ms(f"zero_stage{stage}_{alloc}")
        if t is None:
            print(f"  {alloc} stage {stage}: did not run"); continue
        rel = t / base - 1
        verdict = "" if limit is None else ("  within target" if rel <= limit else f"  OVER the {limit:.0%} target")
        print(f"  {alloc} stage {stage}: {t:.2f} ms vs {base:.2f} ms ({rel:+.1%}){verdict}")
    last0 = runs[f"zero_stage0_{alloc}"][0]["last_loss"]
    same = [s for s in (1, 2, 3) if runs.get(f"zero_stage{s}_{alloc}") and
            abs(float(runs[f"zero_stage{s}_{alloc}"][0]["last_loss"]) - float(last0)) <= 0.02]
    print(f"  {alloc}: last loss of stages {same} within 0.02 of stage 0's {last0}")
    for mode in ("fsdp2", "fsdp2_keep", "ddp"):
        t = ms(f"{mode}_{alloc}")
        if t is not None:
            print(f"  {alloc} {mode} (PyTorch): {t:.2f} ms ({t / base - 1:+.1%} vs zero stage 0)")
if device == "cuda" and ngpu < 2:
    print("\n(one GPU: a smoke run of the script; the comparison needs 2 or more GPUs)")
EOF
exit $status
