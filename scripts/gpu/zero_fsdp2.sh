#!/usr/bin/env bash
# gpumem::zero against PyTorch's FSDP2 (issue 18), on N GPUs of one host, one process per GPU:
#
#   * examples/zero_train at ZeRO stages 0 (plain all-reduce data parallelism), 1, 2 and 3, and
#     (NGPU >= 2) once in one process on one GPU with the same global batch: the losses' reference;
#   * scripts/gpu/zero_fsdp2.py, the same model and data in Python: FSDP2 (fully_shard,
#     reshard after forward), FSDP2 keeping parameters gathered, and DDP;
#
# each with gpumem and with PyTorch's allocator, after the [gpu] trainer test
# (BUILD/tests/checkpointing/zero_trainer_test: ProcessGroupNCCL, side-stream prefetch). Every
# rank reports peak reserved and allocated bytes, step time and the global batch's loss;
# zero_train also its model-state bytes against the ZeRO formulas. The summary (last) puts them
# side by side and checks issue 18's targets: stage 2 within 5% of stage 0's step time, stage 3
# within 15%, the loss of every stage equal to stage 0's and to one GPU's (the same global batch).
#
#   OUT=/tmp/zf scripts/gpu/zero_fsdp2.sh        # every visible GPU (2 or more: the comparison)
#   OUT=/tmp/zf NGPU=1 scripts/gpu/zero_fsdp2.sh # one GPU, at most 60 s: the [gpu] test, zero_train
#       stages 0-3 with each allocator and FSDP2 with each, as a smoke run (a small model; one-GPU
#       step times say nothing about the targets, which need communication between GPUs); runs
#       that do not fit are cut in this order's reverse: stages 0 and 3, FSDP2, stages 1 and 2
#   OUT=/tmp/zf DEVICE=cpu NGPU=2 scripts/gpu/zero_fsdp2.sh   # a check of this script on any
#       machine: NGPU processes over Gloo, a tiny model, no memory numbers with PyTorch's CPU
#       allocator (it keeps none)
#
# Launch: NGPU >= 2: torchrun (python -m torch.distributed.run --standalone), as users launch it.
# NGPU = 1: the launcher's variables are set directly (RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
# MASTER_ADDR=127.0.0.1 MASTER_PORT=a free port; rank 0 serves the store), which saves torchrun's
# few seconds of Python start-up per run and still runs zero_train over ProcessGroupNCCL.
# Nothing is compiled here: binaries come from BUILD (scripts/gpu/env.sh: .gpu/build, staged by
# scripts/gpu/stage.sh): BUILD/examples/zero_train, BUILD/torch/libgpumem_torch.so,
# BUILD/tests/checkpointing/zero_trainer_test. env.sh sets LD_LIBRARY_PATH (BUILD/lib, the torch
# wheel's libraries) and keeps NVLink multicast off; BUILD/torch is added here (zero_train links
# libgpumem_torch.so, whose build-tree RUNPATH does not exist on the GPU machine).
#
# Environment: NGPU (default: every visible GPU), STEPS, BUDGET_S (wall seconds for the whole
# script, default 60 for NGPU=1 and 540 otherwise: a run that would start too close to the end is
# not started and the summary says "cut (budget)"), RUNS (which runs, e.g. "zero_stage0_native
# fsdp2_gpumem"; default: all for NGPU >= 2, the smoke set for NGPU = 1), PY (python3).
# $OUT: zero_fsdp2-summary.txt (the table and verdicts) and zero_fsdp2-logs.tar.gz (each run's
# log, results.txt with every RESULT line, status.txt). Exit status 0 when no run failed.
set -uo pipefail
: "${OUT:?set OUT to the directory for results}"
t_start=$SECONDS
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$gpu_root"
export LD_LIBRARY_PATH=$BUILD/torch:$LD_LIBRARY_PATH
summary=$OUT/zero_fsdp2-summary.txt
logs=$OUT/zero_fsdp2-logs
mkdir -p "$logs"
trap 'tar czf "$OUT/zero_fsdp2-logs.tar.gz" -C "$OUT" zero_fsdp2-logs 2>/dev/null && rm -rf "$logs"' EXIT
results=$logs/results.txt
statuses=$logs/status.txt
: >"$results"
: >"$statuses"
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
budget=${BUDGET_S:-$([ "$ngpu" -ge 2 ] && echo 540 || echo 60)}
left() { echo $((budget - (SECONDS - t_start))); }

if [ "$device" = cpu ]; then  # the script's own check
  model=(--layers 2 --width 64 --heads 4 --seq 32 --vocab 64 --batch $((2 * ngpu)) --lr 6e-4)
  steps=${STEPS:-8}
elif [ "$ngpu" -ge 2 ]; then  # ~150 M parameters, 8 rows of 512 tokens per GPU
  model=(--layers 12 --width 1024 --heads 16 --seq 512 --vocab 256 --batch $((8 * ngpu)) --lr 6e-4)
  steps=${STEPS:-25}
else                          # smoke: ~13 M parameters
  model=(--layers 4 --width 512 --heads 8 --seq 256 --vocab 256 --batch 8 --lr 6e-4)
  steps=${STEPS:-12}
fi
warmup=$((steps > 8 ? 5 : 2))

zero_train=$BUILD/examples/zero_train
lib=$BUILD/torch/libgpumem_torch.so
trainer_test=$BUILD/tests/checkpointing/zero_trainer_test
for f in "$zero_train" "$lib"; do
  if [ ! -f "$f" ]; then
    echo "$f is missing: build zero_train and gpumem_torch on the build machine and stage them" \
         "(scripts/gpu/stage.sh) into BUILD=$BUILD" | tee "$summary"
    exit 1
  fi
done
if ! timeout 30 "$zero_train" --help >"$logs/zero_train_help.txt" 2>&1; then
  echo "$zero_train does not start (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):" | tee "$summary"
  tail -5 "$logs/zero_train_help.txt" | tee -a "$summary"; exit 1
fi

record() { echo "$1 $2 $3" >>"$statuses"; }  # record NAME STATUS SECONDS

if [ "$device" = cuda ]; then  # the [gpu] trainer test: ProcessGroupNCCL, side-stream prefetch
  echo "== [gpu] zero_trainer_test ($(date +%T), $(left) s left)"
  t0=$SECONDS
  if [ ! -x "$trainer_test" ]; then
    status=1; record zero_trainer_test_gpu MISSING 0; echo "$trainer_test is missing"
  elif timeout 30 "$trainer_test" "[gpu]" -s >"$logs/zero_trainer_test_gpu.log" 2>&1; then
    record zero_trainer_test_gpu ok $((SECONDS - t0))
    grep -E "CUDA stage" "$logs/zero_trainer_test_gpu.log" | sort -u >"$logs/gpu_test.txt"
  else
    rc=$?
    status=1; record zero_trainer_test_gpu "FAILED(exit_$rc)" $((SECONDS - t0))
    echo "zero_trainer_test [gpu] FAILED (exit $rc):"; tail -20 "$logs/zero_trainer_test_gpu.log"
  fi
fi

if [ -n "${RUNS:-}" ]; then
  runs=" $RUNS "
elif [ "$ngpu" -lt 2 ]; then  # one GPU: every stage with each allocator, FSDP2 with each
  runs=" zero_stage0_native zero_stage0_gpumem zero_stage3_native zero_stage3_gpumem fsdp2_native"
  runs+=" fsdp2_gpumem zero_stage1_native zero_stage1_gpumem zero_stage2_native zero_stage2_gpumem "
else
  runs=all
fi

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# launch NAME MIN_SECONDS PROGRAM ARGS...: one process per GPU (PROCS=1 launch ...: one process);
# a run needing at least MIN_SECONDS is not started when less is left (it would be killed
# half-way); its timeout is what is left.
launch() {
  local name=$1 need=$2; shift 2
  local t0=$SECONDS remaining rc procs=${PROCS:-$ngpu}
  remaining=$(( $(left) - 3 ))  # 3 s for the summary and the archive
  if [ "$remaining" -lt "$need" ]; then
    record "$name" "cut(budget)" 0; echo "== $name: cut, $remaining s left of the ${budget} s budget"
    return
  fi
  [ "$remaining" -gt 240 ] && remaining=240
  echo "== $name ($(date +%T), timeout ${remaining} s)"
  if [ "$procs" -ge 2 ]; then
    local prog=()
    [[ "$1" == *.py ]] || prog=(--no-python)
    timeout -k 5 "$remaining" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$procs" \
      "${prog[@]}" "$@" >"$logs/$name.log" 2>&1
  else
    [[ "$1" == *.py ]] && set -- "$PY" "$@"
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$(free_port) timeout -k 5 "$remaining" "$@" >"$logs/$name.log" 2>&1
  fi
  rc=$?
  if [ $rc = 0 ] && grep -q '^RESULT' "$logs/$name.log"; then
    record "$name" ok $((SECONDS - t0))
    grep '^RESULT' "$logs/$name.log" | sed "s/^RESULT /RESULT run=$name /" | tee -a "$results" | cut -c1-160
  else
    status=1
    [ $rc = 0 ] && rc="0,no_RESULT"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then  # killed by its timeout: the cap or the budget's end
      if [ "$remaining" -lt 240 ]; then rc="${rc},stopped_at_budget_end"; else rc="${rc},timed_out"; fi
    fi
    record "$name" "FAILED(exit_$rc)" $((SECONDS - t0))
    echo "$name FAILED (exit $rc):"; grep -v '^\[W' "$logs/$name.log" | tail -15
  fi
}

wanted() { [ "$runs" = all ] || [[ "$runs" == *" $1 "* ]]; }
order=()  # the smoke set's order is its priority: what comes last is cut first
if [ "$runs" = all ]; then
  order+=(zero_1gpu_native)  # the reference: one process, the same global batch
  for alloc in native gpumem; do
    for stage in 0 1 2 3; do order+=("zero_stage${stage}_$alloc"); done
    for mode in fsdp2 fsdp2_keep ddp; do
      [ "$device" = cpu ] && [ "$alloc" = gpumem ] && continue  # Python + gpumem: CUDA only
      order+=("${mode}_$alloc")
    done
  done
else
  read -r -a order <<<"$runs"
fi
for name in "${order[@]}"; do
  wanted "$name" || continue
  alloc=${name##*_}
  case $name in
    zero_1gpu_*)  # one process on one GPU, the same global batch: the losses' reference
      PROCS=1 launch "$name" 8 "$zero_train" --device "$device" --stage 0 --allocator "$alloc" \
        --steps "$steps" --log-every 10 "${model[@]}" ;;
    zero_stage[0-3]_*)
      stage=${name#zero_stage}; stage=${stage%%_*}
      launch "$name" 8 "$zero_train" --device "$device" --stage "$stage" --allocator "$alloc" \
        --steps "$steps" --log-every 10 "${model[@]}" ;;
    fsdp2_*|fsdp2_keep_*|ddp_*)
      if [ "$device" = cpu ] && [ "$alloc" = gpumem ]; then
        record "$name" "skipped(gpumem_in_Python_needs_CUDA)" 0; continue
      fi
      mode=${name%_*}
      launch "$name" 15 scripts/gpu/zero_fsdp2.py --mode "$mode" --allocator "$alloc" \
        --lib "$lib" --device "$device" --steps "$steps" --warmup "$warmup" "${model[@]}" ;;
    *) echo "unknown run '$name' in RUNS"; record "$name" "unknown" 0; status=1 ;;
  esac
done

if [ -f "$logs/gpu_test.txt" ]; then
  { echo "[gpu] zero_trainer_test (single GPU, ProcessGroupNCCL):"; cat "$logs/gpu_test.txt"; echo; } >"$summary"
else
  : >"$summary"
fi
"$PY" - "$results" "$statuses" "$ngpu" "$device" "$((SECONDS - t_start))" "$budget" <<'EOF' | tee -a "$summary"
import sys
from collections import defaultdict

path, status_path, ngpu, device, took, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
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
def peak_reserved(name):  # the largest rank's
    return max(float(r.get("peak_reserved_bytes", -1)) for r in runs[name]) if runs.get(name) else -1

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
        if limit is None:
            verdict = ""
        elif device != "cuda" or ngpu < 2:  # no communication between GPUs: nothing to judge
            verdict = f"  (target {limit:.0%}: judged on 2+ GPUs only)"
        else:
            verdict = "  within target" if rel <= limit else f"  OVER the {limit:.0%} target"
        print(f"  {alloc} stage {stage}: {t:.2f} ms vs {base:.2f} ms ({rel:+.1%}){verdict}")
    last0 = runs[f"zero_stage0_{alloc}"][0]["last_loss"]
    ran = [s for s in (1, 2, 3) if runs.get(f"zero_stage{s}_{alloc}")]
    same = [s for s in ran if abs(float(runs[f"zero_stage{s}_{alloc}"][0]["last_loss"]) - float(last0)) <= 0.02]
    print(f"  {alloc}: last loss of stages {same} (of {ran} run) within 0.02 of stage 0's {last0}")
    for mode in ("fsdp2", "fsdp2_keep", "ddp"):
        t = ms(f"{mode}_{alloc}")
        if t is not None:
            print(f"  {alloc} {mode} (PyTorch): {t:.2f} ms ({t / base - 1:+.1%} vs zero stage 0)")

for one in sorted(n for n in runs if n.startswith("zero_1gpu_")):
    ref = runs[one][0]
    print(f"\nlosses against {one} (one process, the same global batch; equal within 0.02):")
    for alloc in ("native", "gpumem"):
        for s in range(4):
            if runs.get(f"zero_stage{s}_{alloc}"):
                r = runs[f"zero_stage{s}_{alloc}"][0]
                d = abs(float(r["last_loss"]) - float(ref["last_loss"]))
                print(f"  {alloc} stage {s} on {ngpu} ranks: {r['first_loss']} -> {r['last_loss']} vs "
                      f"{ref['first_loss']} -> {ref['last_loss']}  {'equal' if d <= 0.02 else 'DIFFERENT'}")

if device == "cuda":
    print("\npeak reserved per rank, gpumem vs PyTorch's allocator (largest rank):")
    for name in [f"zero_stage{s}" for s in range(4)] + ["fsdp2", "fsdp2_keep", "ddp"]:
        n, g = peak_reserved(f"{name}_native"), peak_reserved(f"{name}_gpumem")
        if n > 0 and g > 0:
            print(f"  {name:<12} native {n / 2**20:10.1f} MiB  gpumem {g / 2**20:10.1f} MiB  ({g / n - 1:+.1%})")

print(f"\nruns (wall seconds; the script took {took} s of its {budget} s budget):")
for line in open(status_path):
    name, status, seconds = line.split()
    print(f"  {name:<24}{status:<28}{seconds:>5} s")
if device == "cuda" and ngpu < 2:
    print("\n(one GPU: a smoke run; the step-time targets and the FSDP2 comparison need 2 or more GPUs)")
EOF
exit $status
