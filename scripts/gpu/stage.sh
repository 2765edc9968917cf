#!/usr/bin/env bash
# Stages a build made on the CPU machine for the GPU machine, which compiles nothing: every ELF
# executable and shared library of BUILD (default build/), stripped, in the same relative layout
# but what no GPU script runs, since the archive must fit with the working tree in the device
# tool's 64 MiB: the clang fuzzers of BUILD/fuzz-clang (2.3 MiB of the archive), the tests' installed
# package_consumer copies of the libraries, and every test binary (BUILD/tests/) whose name no file
# of scripts/gpu/ mentions (CPU tests: CI runs them);
# plus the shared libraries they link that the GPU machine may lack (libfmt), packed into
# .gpu/build.tar.xz (git ignores .gpu/). scripts/gpu/env.sh unpacks it there into .gpu/build.
#
#   scripts/setup.sh build && scripts/gpu/stage.sh [BUILD]
#   then: run(carry=[".gpu/build.tar.xz", ...], command="OUT=$OUT scripts/gpu/run_all.sh")
# Binaries built on Debian 12 (g++ 12) against the torch 2.11.0 cu130 wheel run on the GPU machine
# (Ubuntu 24.04) against its own torch 2.11.0+cu130: same libtorch, newer glibc and libstdc++.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# Every word of the GPU scripts (not their own CPU tests, test_*.py): a test binary is staged when
# one of them is its name.
gpu_words=$(find "$root/scripts/gpu" -type f \( -name '*.sh' -o -name '*.py' \) -not -name 'test_*' -exec cat {} + |
            tr -cs 'A-Za-z0-9_' '\n' | sort -u)
n=0
skipped=0
while IFS= read -r -d '' f; do
  file -b "$f" | grep -q '^ELF' || continue
  rel=${f#"$build"/}
  case $rel in
    tests/*) grep -qx "$(basename "$rel")" <<<"$gpu_words" || { skipped=$((skipped + 1)); continue; } ;;
  esac
  mkdir -p "$stage/$(dirname "$rel")"
  strip --strip-all -o "$stage/$rel" "$f" 2>/dev/null || cp "$f" "$stage/$rel"
  n=$((n + 1))
done < <(find "$build" -type f -not -path '*/CMakeFiles/*' -not -path "$build/fuzz-clang/*" -not -path '*/package_consumer/*' \
           \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0)
mkdir -p "$stage/lib"
for lib in $(find "$stage" -type f -exec sh -c 'ldd "$1" 2>/dev/null' _ {} \; | awk '/libfmt\.so/ { print $3 }' | sort -u); do
  cp -L "$lib" "$stage/lib/"
done
# The Python package (issue 16) as a wheel made from this build tree (seconds, compiles nothing):
# py3-none-linux_x86_64, so the GPU machine's Python 3.12 installs what this venv's 3.11 built.
# scripts/gpu/package.sh installs it from BUILD/wheels with pip --no-deps --no-index --target.
if [ -f "$build/torch/libgpumem_torch.so" ] && [ -x "$build/cli/gpumem" ]; then
  "$root/scripts/build_wheel.sh" "$build" "$stage/wheels" || echo "stage: WARNING: scripts/build_wheel.sh failed; package.sh will report no wheel" >&2
fi
out=${GPUMEM_STAGE_OUT:-$root/.gpu/build.tar.xz}  # another path: scripts/gpu/test_stage.py
mkdir -p "$(dirname "$out")"
tar cJf "$out" -C "$stage" .
echo "stage: $n binaries from $build ($skipped CPU-only test binaries left out) -> $out ($(du -h "$out" | cut -f1))"
