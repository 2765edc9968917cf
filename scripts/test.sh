#!/usr/bin/env bash
# Quick start command 2: sets up, builds and runs the whole test suite, then runs the core suite
# again built with AddressSanitizer and UndefinedBehaviorSanitizer, and the threaded tests built with
# ThreadSanitizer. .ci/run calls this. Every build treats compiler warnings as errors
# (GPUMEM_WERROR=ON; a plain scripts/setup.sh build does not).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh "$root/build" -DGPUMEM_WERROR=ON
ctest --test-dir "$root/build" --output-on-failure --timeout 1500 -j "${GPUMEM_JOBS:-$(nproc)}"

if [ "${GPUMEM_SKIP_SANITIZERS:-0}" != 1 ]; then
  # The sanitizer build leaves out libtorch (its wheel is not built with sanitizers).
  GPUMEM_WITH_TORCH=OFF GPUMEM_BUILD_TYPE=Debug scripts/setup.sh "$root/build-asan" \
    -DGPUMEM_SANITIZE=address,undefined -DGPUMEM_WITH_BENCH=OFF -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WERROR=ON
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$root/build-asan" --output-on-failure --timeout 1500 -j "${GPUMEM_JOBS:-$(nproc)}"

  # ThreadSanitizer over the tests whose threads meet in the engine: thread caches and their leases,
  # the engine lock, the stats observer's shards, the live table's shards, the observers, the
  # engine stress test, the arenas, the step planner's lock and its layout thread, and the two-thread benchmark smoke runs. Only their targets are
  # built. The test names are the targets' names, except bench_alloc_pairs' runs
  # (bench_alloc_pairs_shared, _own and _arenas); a target missing from the build leaves its test
  # "Not Run", which fails.
  GPUMEM_WITH_TORCH=OFF GPUMEM_BUILD_TARGETS="test_thread_cache test_engine_locking test_engine_stress test_stats \
test_caching_allocator test_live_table test_engine_capture test_arenas test_step_plan test_engine_step_plan forensics_test_observers bench_alloc_pairs" \
    scripts/setup.sh "$root/build-tsan" -DGPUMEM_SANITIZE=thread -DGPUMEM_WITH_VIEWER=OFF -DGPUMEM_WERROR=ON
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir "$root/build-tsan" --output-on-failure --timeout 1500 -j "${GPUMEM_JOBS:-$(nproc)}" \
    -R '^(test_thread_cache|test_engine_locking|test_engine_stress|test_stats|test_caching_allocator|test_live_table|test_engine_capture|test_arenas|test_step_plan|test_engine_step_plan|forensics_test_observers|bench_alloc_pairs_shared|bench_alloc_pairs_own|bench_alloc_pairs_arenas)$' \
    --no-tests=error
fi
