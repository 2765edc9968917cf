#!/bin/bash
# ab.sh REPS BIN... : alternates the binaries REPS times pinned to core 1; prints per binary the per-run medians
reps=$1; shift
out=${AB_OUT:-/tmp/ab.$$}; mkdir -p $out
for i in $(seq $reps); do for b in "$@"; do
  taskset -c 1 $b --ops 150000 --threads 0 --rounds 3 --pattern "4 KiB" --pattern "window 64" --pattern "window 1024" 2>&1 \
   | grep -E "^(4 KiB|window)" | awk '{for(i=1;i<=NF;i++) if ($i ~ /^\(/) {print $(i-1); break}}' | paste -sd' ' >> $out/$(basename $b)
done; done
for b in "$@"; do n=$(basename $b); python3 - $out/$n $n <<'PY'
import sys,statistics
rows=[list(map(float,l.split())) for l in open(sys.argv[1]) if l.strip()]
cols=list(zip(*rows))
print(f"{sys.argv[2]:>10}", "  ".join(f"{statistics.median(c):6.1f} ({min(c):.1f}..{max(c):.1f})" for c in cols), f"n={len(rows)}")
PY
done
