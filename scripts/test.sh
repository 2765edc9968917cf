#!/usr/bin/env bash
# Quick start command 2: sets up, builds and runs the whole test suite, then runs the core suite
# again built with AddressSanitizer and UndefinedBehaviorSanitizer. .ci/run calls this. Both builds
# treat compiler warnings as errors (GPUMEM_WERROR=ON; a plain scripts/setup.sh build does not).
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
fi
