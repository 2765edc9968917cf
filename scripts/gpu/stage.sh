#!/usr/bin/env bash
# Stages a build made on the CPU machine for the GPU machine, which compiles nothing: every ELF
# executable and shared library of BUILD (default build/), stripped, in the same relative layout,
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
n=0
while IFS= read -r -d '' f; do
  file -b "$f" | grep -q '^ELF' || continue
  rel=${f#"$build"/}
  mkdir -p "$stage/$(dirname "$rel")"
  strip --strip-all -o "$stage/$rel" "$f" 2>/dev/null || cp "$f" "$stage/$rel"
  n=$((n + 1))
done < <(find "$build" -type f -not -path '*/CMakeFiles/*' \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0)
mkdir -p "$stage/lib"
for lib in $(find "$stage" -type f -exec sh -c 'ldd "$1" 2>/dev/null' _ {} \; | awk '/libfmt\.so/ { print $3 }' | sort -u); do
  cp -L "$lib" "$stage/lib/"
done
mkdir -p "$root/.gpu"
tar cJf "$root/.gpu/build.tar.xz" -C "$stage" .
echo "stage: $n binaries from $build -> .gpu/build.tar.xz ($(du -h "$root/.gpu/build.tar.xz" | cut -f1))"
