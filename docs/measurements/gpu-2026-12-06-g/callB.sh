# Issue 13's rows with the step planner as the default (main a2309e4) and with step_plan:False,
# alternated in fresh processes: the engine alone with one thread pinned to one core, and
# torch_alloc_pairs (PyTorch's allocator and gpumem alternating round by round inside each process)
# pinned to four cores. Binaries built on the CPU machine, carried as .gpu/build.tar.xz.
set -u
source scripts/gpu/env.sh >/dev/null 2>&1 || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E 'Model name|^CPU\(s\)'
date -u
for i in 1 2 3; do
  for v in default noplan; do
    conf=(); [ $v = noplan ] && conf=(--config step_plan:False)
    echo "== engine 1 thread, $v, run $i"
    taskset -c 2 $BUILD/bench/bench_alloc_pairs --ops 150000 --threads 0 --rounds 3 "${conf[@]}" 2>&1 |
      grep -E '^(4 KiB|1 MiB|64 MiB|window)' | cut -c1-200
    echo "== torch_alloc_pairs, $v, run $i"
    taskset -c 2-5 timeout 120 $BUILD/bench/torch_alloc_pairs --ops 200000 --thread-ops 20000 --threads 4 --rounds 3 "${conf[@]}" 2>&1 | tail -25
    date -u
  done
done
