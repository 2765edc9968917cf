#!/usr/bin/env bash
# Makes the gpumem Python wheel from an existing build tree, compiling nothing (seconds): the
# tree's libgpumem_torch.so and gpumem program, the shared libraries they need beyond torch, and
# python/gpumem. The wheel is py3-none-linux_x86_64 (no Python extension inside) and runs with
# the torch the tree was built against (2.11 here and on the GPU machine).
#
#   scripts/build_wheel.sh [BUILD_DIR] [OUT_DIR]      (defaults: build/, .gpu/wheels/)
#   then, elsewhere: pip install --no-deps --no-index --target /tmp/site OUT_DIR/gpumem-*.whl
#
# The build tree needs the targets gpumem_torch and gpumem (scripts/setup.sh builds them); the
# python that builds the wheel needs torch and scikit-build-core (scripts/setup.sh's venv has both).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/.gpu/wheels}
py=${GPUMEM_PYTHON:-${GPUMEM_DEPS:-$HOME/.cache/gpumem}/venv/bin/python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/gpumem-*.whl
t0=$(date +%s)
"$py" -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir "$out" \
  -C cmake.define.GPUMEM_PREBUILT_DIR="$build" -C build-dir="$build/python-wheel" "$root"
wheel=$(ls "$out"/gpumem-*.whl)
echo "build_wheel: $wheel ($(du -h "$wheel" | cut -f1), $(( $(date +%s) - t0 )) s)"
