#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in their own build directory and
# runs each for a bounded time from seed corpora made of the repository's traces. CI runs it through
# ctest (the fuzz_smoke test, 20 s per target); run it by hand for longer.
#
#   scripts/fuzz.sh [--build DIR] [--seconds N] [--out DIR] [--jobs N] [TARGET...]
#
# DIR defaults to build-fuzz; N to 20 seconds per target; --out keeps the corpora and any crash
# (crash-*, leak-*, timeout-*, oom-*) there (default DIR/runs). Exit: 0 when no target found
# anything, 1 when one did (its reproducer path is printed), 77 when clang or libFuzzer is missing
# (ctest shows the test as skipped).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-fuzz"; seconds=20; out=""; jobs=2; targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_pickle fuzz_json fuzz_csv fuzz_config fuzz_report)
out=${out:-$build/runs}

cxx=${GPUMEM_FUZZ_CXX:-$(command -v clang++ || true)}
cc=${GPUMEM_FUZZ_CC:-$(command -v clang || true)}
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "SKIPPED: clang++ is not installed (scripts/setup.sh installs clang and libclang-rt-14-dev); no fuzzing ran"
  exit 77
fi
probe=$(mktemp -d)
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
  echo "SKIPPED: $cxx cannot link libFuzzer with ASan/UBSan (install libclang-rt-14-dev):"; cat "$probe/err"
  rm -rf "$probe"; exit 77
fi
rm -rf "$probe"

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_C_COMPILER="$cc" "${launcher[@]}" -DGPUMEM_FUZZ=ON -DGPUMEM_WITH_TORCH=OFF -DGPUMEM_WITH_TESTS=OFF \
    -DGPUMEM_WITH_BENCH=OFF -DGPUMEM_WITH_VIEWER=OFF >"$build.configure.log" 2>&1 \
    || { echo "FAILED: configuring the fuzz build (log: $build.configure.log)"; tail -20 "$build.configure.log"; exit 1; }
fi
cmake --build "$build" --target "${targets[@]}" -j "$jobs" >"$build/build.log" 2>&1 \
  || { echo "FAILED: building the fuzz targets (log: $build/build.log)"; grep -m5 -A5 error "$build/build.log"; exit 1; }

# Seeds: prefixes of the shipped CSV traces (decompressed), the measured-peaks JSON files, small
# snapshots as JSON and pickle (when python3 is there), configuration strings.
seeds="$out/seeds"; rm -rf "$seeds"; mkdir -p "$seeds"/{csv,json,pickle,config,report}
n=0
for f in "$root"/traces/*.trace.csv.gz "$root"/traces/corpus/native/*.trace.csv.gz; do
  [ -f "$f" ] || continue
  n=$((n + 1)); [ $n -le 12 ] || break
  gzip -dc "$f" 2>/dev/null | head -c 4096 > "$seeds/csv/$(basename "$f" .gz)"
  head -c 8192 "$f" > "$seeds/report/$(basename "$f")"
done
n=0
for f in "$root"/traces/*.json "$root"/traces/corpus/native/*.json; do
  [ -f "$f" ] || continue
  n=$((n + 1)); [ $n -le 8 ] || break
  head -c 16384 "$f" > "$seeds/json/$(basename "$f")"
done
cat > "$seeds/json/snapshot.json" <<'JSON'
{"segments": [{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0, "segment_type": "small",
  "allocated_size": 512, "active_size": 512, "requested_size": 500,
  "blocks": [{"address": 4096, "size": 512, "requested_size": 500, "state": "active_allocated",
              "frames": [{"name": "f", "filename": "a.py", "line": 3}]},
             {"address": 4608, "size": 2096640, "requested_size": 0, "state": "inactive"}]}],
 "device_traces": [[{"action": "segment_alloc", "addr": 4096, "size": 2097152, "stream": 0, "time_us": 1},
                    {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 2,
                     "frames": [{"name": "f", "filename": "a.py", "line": 3}]},
                    {"action": "oom", "addr": 0, "size": 1048576, "stream": 0, "time_us": 3, "device_free": 0}]]}
JSON
cp "$seeds/json/snapshot.json" "$seeds/report/"
if command -v python3 >/dev/null; then
  python3 - "$seeds/json/snapshot.json" "$seeds/pickle" <<'PY' && cp "$seeds"/pickle/* "$seeds/report/"
import json, pickle, sys
snap = json.load(open(sys.argv[1]))
snap["allocator_settings"] = {"expandable_segments": True, "max_split_size": -1}
for proto in (2, 4, 5):
    with open(f"{sys.argv[2]}/snapshot.p{proto}", "wb") as f:
        pickle.dump(snap, f, protocol=proto)
PY
fi
printf 'expandable_segments:True,max_split_size_mb:128' > "$seeds/config/a"
printf 'garbage_collection_threshold:0.8,roundup_power2_divisions:[256:1,512:2,>:8]' > "$seeds/config/b"
printf 'backend:native,pinned_use_cuda_host_register:True' > "$seeds/config/c"
printf 'thread_cache:False,expandable_segments:False' > "$seeds/config/d"

status=0
summary=()
for t in "${targets[@]}"; do
  case "$t" in
    fuzz_pickle) s=pickle ;; fuzz_json) s=json ;; fuzz_csv) s=csv ;; fuzz_config) s=config ;; *) s=report ;;
  esac
  corpus="$out/corpus/$t"; mkdir -p "$corpus" "$out/artifacts"
  log="$out/$t.log"
  # -rss_limit_mb / -timeout: unbounded memory or time is a finding too.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    timeout $((seconds + 60)) "$build/fuzz/$t" "$corpus" "$seeds/$s" -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$t-" >"$log" 2>&1
  rc=$?
  runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  if [ $rc -eq 0 ]; then
    summary+=("$t: ok, $runs inputs in ${seconds} s")
  else
    status=1
    summary+=("$t: FOUND SOMETHING (exit $rc; log $log; reproducer: $(ls "$out"/artifacts/$t-* 2>/dev/null | head -1))")
    grep -m1 -B2 -A25 -E 'ERROR: |runtime error|deadly signal' "$log" | head -40
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
