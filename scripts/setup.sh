#!/usr/bin/env bash
# Installs what gpumem needs and is missing, then configures and builds. Idempotent: a second run
# installs nothing and rebuilds only what changed.
#
#   scripts/setup.sh [BUILD_DIR] [extra cmake args...]
#
# GPUMEM_BUILD_TARGETS="a b ..." builds only those targets (and what they need) instead of all of
# them; GPUMEM_WITH_TORCH=OFF leaves libtorch out; GPUMEM_BUILD_TYPE sets CMAKE_BUILD_TYPE.
#
# Debian packages come from apt-get; libtorch comes from the PyPI wheel torch==2.11.0, installed
# into a virtual environment that later runs reuse ($GPUMEM_DEPS, default ~/.cache/gpumem).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
shift || true
deps=${GPUMEM_DEPS:-$HOME/.cache/gpumem}
venv=$deps/venv
torch_version=2.11.0
# The GPU machine's versions beside torch 2.11: live.py's workloads build their models with them, and
# its CPU dry run (ctest live_tools) runs only where they import.
transformers_version=5.17.0
torchvision_version=0.26.0

log() { printf '[setup] %s\n' "$*" >&2; }

# ---- Debian packages ----
need=()
# clang, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes): the fuzz targets (fuzz/, scripts/fuzz.sh).
# file, xz-utils: scripts/gpu/stage.sh (which binaries are ELF; the archive), tested by ctest stage_tools.
# libgloo-dev: only the headers ProcessGroupGloo.hpp includes (the torch wheel has Gloo inside
# libtorch_cpu but not its headers); gpumem::zero's multi-process CPU tests need them.
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for pkg in build-essential cmake ninja-build pkg-config libfmt-dev libboost-dev catch2 zlib1g-dev \
           libncurses-dev libjemalloc-dev tmux python3 python3-venv libgloo-dev clang libclang-rt-14-dev \
           file xz-utils; do
  have_pkg "$pkg" || need+=("$pkg")
done
# python3-venv is only needed when the system python lacks venv (pyenv builds ship it).
if [ ${#need[@]} -gt 0 ] && printf '%s\n' "${need[@]}" | grep -qx python3-venv \
   && python3 -c 'import venv, ensurepip' 2>/dev/null; then
  need=("${need[@]/python3-venv}")
fi
need=($(printf '%s\n' "${need[@]}" | grep -v '^$' || true))
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# ---- libtorch from the torch wheel ----
if [ "${GPUMEM_WITH_TORCH:-ON}" != OFF ]; then
  if ! "$venv/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    log "installing torch==$torch_version into $venv (a few GB, once)"
    mkdir -p "$deps"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    if ! "$venv/bin/python" -m pip install -q "torch==$torch_version" numpy; then
      log "ERROR: could not install torch==$torch_version from PyPI; building without libtorch."
      log "       Torch-dependent targets (torch/, checkpointing, examples) are left out."
      export GPUMEM_WITH_TORCH=OFF
    fi
  fi
fi

# scikit-build-core: the build backend of the Python package (pyproject.toml); tests/python builds
# its wheel with the venv's python (pip --no-build-isolation, so the wheel links this torch).
if [ "${GPUMEM_WITH_TORCH:-ON}" != OFF ] && ! "$venv/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
  log "installing scikit-build-core into $venv (the Python package's build backend)"
  "$venv/bin/python" -m pip install -q "scikit-build-core>=0.10,<2" || log "WARNING: could not install scikit-build-core; the python_package test will fail"
fi

# transformers and torchvision: the live scripts' models (scripts/gpu/live/workloads.py), tested on
# the CPU by ctest live_tools (live.py --dry-run-cpu), which shows as skipped without them.
if [ "${GPUMEM_WITH_TORCH:-ON}" != OFF ] && ! "$venv/bin/python" -c "import transformers,torchvision,sys; sys.exit(transformers.__version__ != '$transformers_version' or torchvision.__version__.split('+')[0] != '$torchvision_version')" 2>/dev/null; then
  log "installing transformers==$transformers_version and torchvision==$torchvision_version into $venv (the live scripts' models)"
  "$venv/bin/python" -m pip install -q "transformers==$transformers_version" "torchvision==$torchvision_version" "torch==$torch_version" ||
    log "WARNING: could not install transformers / torchvision; ctest live_tools will show as skipped"
fi

cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${GPUMEM_BUILD_TYPE:-RelWithDebInfo})
if [ "${GPUMEM_WITH_TORCH:-ON}" != OFF ]; then
  torch_prefix=$("$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake_args+=(-DCMAKE_PREFIX_PATH="$torch_prefix" -DGPUMEM_WITH_TORCH=ON
               -DGPUMEM_PYTHON="$venv/bin/python")
else
  cmake_args+=(-DGPUMEM_WITH_TORCH=OFF)
fi
[ -d /usr/local/cuda ] && cmake_args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)

# ---- jemalloc for gpumem::pinned, built from Debian's source without initial-exec TLS ----
# (scripts/stage_jemalloc.sh says why; once, about a minute). Without it the pinned allocator uses
# Debian's binary archive, which a late dlopen (Python) can only load with GLIBC_TUNABLES.
jemalloc_dir=$deps/jemalloc-5.3.0-gd
if "$root/scripts/stage_jemalloc.sh" "$jemalloc_dir"; then
  cmake_args+=(-DGPUMEM_JEMALLOC_ROOT="$jemalloc_dir")
else
  log "WARNING: could not build jemalloc from Debian's source; gpumem::pinned uses libjemalloc-dev's archive"
fi

log "configuring $build"
cmake "${cmake_args[@]}" "$@" >/dev/null
log "building $build"
targets=()
for t in ${GPUMEM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" --parallel "${GPUMEM_JOBS:-$(nproc)}" "${targets[@]}"
