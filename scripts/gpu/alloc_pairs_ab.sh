#!/usr/bin/env bash
# Two engines' bench_alloc_pairs side by side in one run, alternated (A B A B ...), each run pinned
# to fixed cores, so that the host's drift between runs falls on both alike and every run of a
# kind sits on the same cores (the H200 host placed whole processes on fast or slow cores: one
# thread's 4 KiB pair read 60 or 100 ns by process, unpinned).
# Per engine and alternation: the one-thread measurements (--threads 0) pinned to AB_CPUS_1, then,
# if AB_THREADS > 0, the AB_THREADS-thread ones (--threads AB_THREADS; the one-thread rows that run
# prints are dropped) pinned to AB_CPUS_N. Each run prints its TSV rows (pairs, pattern, threads,
# median ns, min, max; bench/alloc_pairs.cpp); at the end, per pattern and thread count, each
# engine's medians in run order and the median of those medians.
#
#   OUT=/dir scripts/gpu/alloc_pairs_ab.sh BIN_A BIN_B [REPS] [-- BENCH_ARGS...]
#     BIN_A, BIN_B   two bench_alloc_pairs binaries (e.g. $BUILD/bench/bench_alloc_pairs_main and
#                    $BUILD/bench/bench_alloc_pairs)
#     REPS           alternations (default 3)
#     BENCH_ARGS     passed to every run, without --threads (default: --ops 150000 --rounds 3)
#   AB_THREADS       threads of the multi-thread runs (default 4; 0: one-thread runs only)
#   AB_CPUS_1        cores of the one-thread runs, taskset -c syntax (default 2)
#   AB_CPUS_N        cores of the multi-thread runs (default 2-5)
#   AB_DEADLINE_S    no run starts after this many seconds (default 100); each run is cut after
#                    AB_RUN_TIMEOUT_S (default 30) and says so.
# $OUT gets ab.tsv (every row, with engine and rep) and ab-summary.txt; both also go to stdout.
# Binaries from scripts/gpu/stage.sh; nothing is compiled here.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
: "${OUT:?set OUT}"
usage() {
  echo "usage: OUT=/dir $0 BIN_A BIN_B [REPS] [-- BENCH_ARGS...]  (BENCH_ARGS without --threads; see AB_THREADS)" >&2
  exit 2
}
[ $# -lt 2 ] && usage
a=$1 b=$2
shift 2
reps=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  reps=$1
  shift
fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--ops 150000 --rounds 3)
for x in "${args[@]}"; do
  if [ "$x" = "--threads" ]; then
    echo "alloc_pairs_ab: give the thread count as AB_THREADS, not --threads (each run sets it)" >&2
    exit 2
  fi
done
for bin in "$a" "$b"; do
  if [ ! -x "$bin" ]; then
    echo "alloc_pairs_ab: $bin is not an executable; stage it with scripts/gpu/stage.sh" >&2
    exit 2
  fi
done
case $reps in '' | *[!0-9]* | 0) echo "alloc_pairs_ab: REPS must be a positive integer, got '$reps'" >&2; exit 2 ;; esac
threads=${AB_THREADS:-4}
case $threads in '' | *[!0-9]*) echo "alloc_pairs_ab: AB_THREADS must be a whole number, got '$threads'" >&2; exit 2 ;; esac
cpus1=${AB_CPUS_1:-2}
cpusn=${AB_CPUS_N:-2-5}
if ! command -v taskset >/dev/null; then
  echo "alloc_pairs_ab: taskset (util-linux) is needed to pin the runs; install it or run elsewhere" >&2
  exit 2
fi
for c in "$cpus1" "$cpusn"; do
  if ! taskset -c "$c" true 2>/dev/null; then
    echo "alloc_pairs_ab: cannot pin to cores '$c' here (taskset -c $c failed; this machine has $(nproc) cores); set AB_CPUS_1 / AB_CPUS_N" >&2
    exit 2
  fi
done
deadline=${AB_DEADLINE_S:-100}
run_timeout=${AB_RUN_TIMEOUT_S:-30}
mkdir -p "$OUT"
tsv=$OUT/ab.tsv
summary=$OUT/ab-summary.txt
printf 'engine\trep\tpairs\tpattern\tthreads\tmedian_ns\tmin_ns\tmax_ns\n' >"$tsv"
start=$SECONDS
status=0
echo "A = $a"
echo "B = $b"
echo "args: ${args[*]}; $reps alternations; one-thread runs pinned to cores $cpus1 (taskset -c)"
[ "$threads" -gt 0 ] && echo "$threads-thread runs pinned to cores $cpusn (their one-thread rows dropped)"
# run ENGINE REP CPUS THREADS KEEP: one pinned run; its rows with threads == KEEP go to the TSV.
run() {
  local engine=$1 rep=$2 cpus=$3 nthreads=$4 keep=$5 bin=$a out rc
  [ "$engine" = B ] && bin=$b
  echo "== $engine rep $rep, --threads $nthreads on cores $cpus ($((SECONDS - start)) s)"
  out=$(timeout "$run_timeout" taskset -c "$cpus" "$bin" "${args[@]}" --threads "$nthreads" --tsv 2>&1)
  rc=$?
  echo "$out"
  if [ $rc -ne 0 ]; then
    echo "alloc_pairs_ab: $engine rep $rep (--threads $nthreads) exited $rc (124: cut after ${run_timeout}s)"
    status=1
  fi
  echo "$out" | awk -F'\t' -v e="$engine" -v r="$rep" -v k="$keep" '$1 == "pairs" && $3 == k { print e "\t" r "\t" $0 }' >>"$tsv"
}
for ((rep = 1; rep <= reps; rep++)); do
  for engine in A B; do
    if ((SECONDS - start > deadline)); then
      echo "alloc_pairs_ab: deadline ${deadline}s reached before $engine rep $rep; stopping"
      status=1
      break 2
    fi
    run "$engine" "$rep" "$cpus1" 0 1
    [ "$threads" -gt 0 ] && run "$engine" "$rep" "$cpusn" "$threads" "$threads"
  done
done
# Per pattern and threads: each engine's medians in run order, and their median.
awk -F'\t' 'NR > 1 {
    key = $4 "\t" $5; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    v[key, $1] = v[key, $1] (v[key, $1] == "" ? "" : " / ") $6
    c[key, $1]++; x[key, $1, c[key, $1]] = $6
  }
  function med(key, e,   m, i, j, t, a) {
    m = c[key, e]; if (m == 0) return "-"
    for (i = 1; i <= m; i++) a[i] = x[key, e, i] + 0
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    printf "%-28s %-7s %-36s %-36s %9s %9s\n", "pattern", "threads", "A medians (ns/pair/thread)", "B medians", "A median", "B median"
    for (i = 1; i <= n; i++) {
      split(order[i], p, "\t")
      printf "%-28s %-7s %-36s %-36s %9s %9s\n", p[1], p[2], v[order[i], "A"], v[order[i], "B"], med(order[i], "A"), med(order[i], "B")
    }
  }' "$tsv" | tee "$summary"
echo "pinning: one-thread runs on cores $cpus1, $threads-thread runs on cores $cpusn"
echo "total $((SECONDS - start)) s"
exit $status
