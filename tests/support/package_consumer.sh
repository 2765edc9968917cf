#!/usr/bin/env bash
# Installs the gpumem build tree into a scratch prefix, then configures, builds and runs a consumer
# project against it, as a user would with find_package(gpumem).
#   package_consumer.sh PROJECT_DIR BUILD_DIR SCRATCH_DIR [EXTRA_PREFIX_PATH]
# EXTRA_PREFIX_PATH: where else find_package looks (libtorch's CMake prefix for gpumem::torch).
set -euo pipefail
project=$1 build=$2 scratch=$3 extra=${4:-}
rm -rf "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
prefix_path="$scratch/prefix"
[ -n "$extra" ] && prefix_path="$prefix_path;$extra"
cmake -S "$project" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix_path" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
"$scratch/build/consumer"
