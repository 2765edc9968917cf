#!/usr/bin/env bash
# Installs the gpumem build tree into a scratch prefix, then configures, builds and runs the
# consumer project against it, as a user would with find_package(gpumem).
#   run.sh BUILD_DIR SCRATCH_DIR TORCH_CMAKE_PREFIX
set -euo pipefail
build=$1 scratch=$2 torch_prefix=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
cmake -S "$here" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix;$torch_prefix" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
"$scratch/build/consumer"
