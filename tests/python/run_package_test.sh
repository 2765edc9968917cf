#!/usr/bin/env bash
# CI's check of the Python package: makes the wheel from this build tree (scripts/build_wheel.sh,
# compiling nothing), installs it into the python's environment (scripts/setup.sh's venv), and
# runs tests/python/test_package.py with that python.
#
#   tests/python/run_package_test.sh BUILD_DIR PYTHON
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$1
py=$2
if ! "$py" -c 'import scikit_build_core' 2>/dev/null; then
  echo "FAIL: $py has no scikit-build-core, which builds the gpumem wheel; scripts/setup.sh installs it" >&2
  exit 1
fi
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
GPUMEM_PYTHON=$py "$root/scripts/build_wheel.sh" "$build" "$wheels"
"$py" -m pip install --quiet --no-deps --force-reinstall "$wheels"/gpumem-*.whl
# The wheel ships libgpumem_pinned_torch.so exactly when the build tree has it.
export GPUMEM_EXPECT_PINNED=0
[ -f "$build/torch/libgpumem_pinned_torch.so" ] && GPUMEM_EXPECT_PINNED=1
cd "$wheels"  # not the repository: `import gpumem` must find the installed package
"$py" "$root/tests/python/test_package.py"
