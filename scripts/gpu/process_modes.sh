#!/usr/bin/env bash
# Whether a one-thread engine run's speed follows its process's address layout or the moment it
# ran. On the H200 host the one-thread pairs are bimodal by process (1 MiB pairs 84-86 or 149-153 ns
# per pair, each process's rounds within a few ns of one another; docs/measurements/
# h200-2026-12-03-e/freeindex-ab.tsv). This runs the same binary in fresh processes, alternating
# address-space randomization on and off (setarch -R), every process pinned to one core, and prints
# per process: index, mode, start time, and the medians of 4 KiB, 1 MiB and window 64 pairs.
#
#   OUT=/dir scripts/gpu/process_modes.sh BIN [PROCESSES_PER_MODE] [CPU]
# $OUT gets modes.tsv (also on stdout).
set -uo pipefail
: "${OUT:?set OUT}"
bin=${1:?usage: OUT=/dir $0 BIN [PROCESSES_PER_MODE] [CPU]}
n=${2:-8}
cpu=${3:-2}
mkdir -p "$OUT"
printf 'process\tmode\tstart_s\t4k_ns\t1m_ns\tw64_ns\n' | tee "$OUT/modes.tsv"
t0=$(date +%s.%N)
for i in $(seq 1 "$n"); do
  for mode in aslr fixed; do
    pre=()
    [ "$mode" = fixed ] && pre=(setarch "$(uname -m)" -R)
    t=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
    r=$("${pre[@]}" taskset -c "$cpu" "$bin" --ops 150000 --threads 0 --rounds 3 --pattern '4 KiB' \
        --pattern '1 MiB' --pattern 'window 64' --tsv | awk -F'\t' '{ printf "\t%s", $4 }')
    printf '%s\t%s\t%s%s\n' "$i" "$mode" "$t" "$r" | tee -a "$OUT/modes.tsv"
  done
done
