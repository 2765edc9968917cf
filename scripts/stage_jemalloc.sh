#!/usr/bin/env bash
# Copies the jemalloc that gpumem::pinned builds against (Debian's libjemalloc-dev: jemalloc.h and
# the position-independent static archive libjemalloc_pic.a, 1.4 MB) into a folder that can travel
# to a machine without the package, such as the GPU machine:
#
#   scripts/stage_jemalloc.sh [DIR]          (default: .deps/jemalloc, ignored by git)
#
# then, there:  cmake ... -DGPUMEM_JEMALLOC_ROOT=DIR   (scripts/gpu/pinned.sh does this itself).
# The archive is renamed at build time (pinned/cmake/rename_jemalloc.cmake), as from the package.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.deps/jemalloc}
header=/usr/include/jemalloc/jemalloc.h
archive=$(find /usr/lib /usr/lib64 -name libjemalloc_pic.a 2>/dev/null | head -1 || true)
if [ ! -f "$header" ] || [ -z "$archive" ]; then
  echo "stage_jemalloc: $header or libjemalloc_pic.a is missing; install Debian's libjemalloc-dev" \
       "(apt-get install libjemalloc-dev, or scripts/setup.sh)" >&2
  exit 1
fi
mkdir -p "$dir/include/jemalloc" "$dir/lib"
cp "$header" "$dir/include/jemalloc/"
cp "$archive" "$dir/lib/"
version=$(dpkg-query -W -f='${Version}' libjemalloc-dev 2>/dev/null || echo unknown)
echo "libjemalloc-dev $version from $(. /etc/os-release && echo "$PRETTY_NAME")" >"$dir/SOURCE"
echo "stage_jemalloc: $dir (jemalloc.h, $(basename "$archive"), libjemalloc-dev $version)"
