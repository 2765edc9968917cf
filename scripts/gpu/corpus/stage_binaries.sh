#!/usr/bin/env bash
# Stages the corpus's two C++ workloads for the GPU machine: copies checkpoint_llama, zero_train
# and libgpumem_torch.so from a torch-enabled build into DEST (default .gpu/bin, which git
# ignores), without debug info (a few MB instead of ~60), with the libfmt they link, and checks
# that they carry --record-native-history and resolve their libraries against this machine's torch.
#
#   cmake --build BUILD --target checkpoint_llama zero_train
#   scripts/gpu/corpus/stage_binaries.sh BUILD [DEST]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
build=${1:?usage: stage_binaries.sh BUILD_DIR [DEST] (BUILD_DIR: a build with GPUMEM_WITH_TORCH=ON)}
dest=${2:-$root/.gpu/bin}
for t in checkpoint_llama zero_train; do
  if [ ! -x "$build/examples/$t" ]; then
    echo "stage_binaries: $build/examples/$t is missing; build it first:" >&2
    echo "  cmake --build $build --target checkpoint_llama zero_train" >&2
    exit 1
  fi
  if ! grep -q -- "--record-native-history" "$build/examples/$t"; then
    echo "stage_binaries: $build/examples/$t predates --record-native-history; rebuild it" >&2
    exit 1
  fi
done
lib=$(find "$build" -name libgpumem_torch.so -print -quit)
[ -n "$lib" ] || { echo "stage_binaries: no libgpumem_torch.so under $build" >&2; exit 1; }
mkdir -p "$dest"
for f in "$build/examples/checkpoint_llama" "$build/examples/zero_train" "$lib"; do
  strip --strip-debug -o "$dest/$(basename "$f")" "$f"
done
fmt=$(ldd "$build/examples/zero_train" | awk '/libfmt/ { print $3; exit }')
[ -z "$fmt" ] || cp -L "$fmt" "$dest/"
ls -la "$dest"
du -sh "$dest"
python=${PYTHON:-python3}
if path=$("$python" "$root/scripts/gpu/corpus/capture.py" --print-library-path --bin-dir "$dest" 2>/dev/null); then
  for t in checkpoint_llama zero_train; do
    if LD_LIBRARY_PATH="$path" ldd "$dest/$t" | grep "not found"; then
      echo "stage_binaries: $t misses libraries (above) with LD_LIBRARY_PATH=$path" >&2
      exit 1
    fi
  done
  echo "stage_binaries: both resolve their libraries with the torch of $python"
else
  echo "stage_binaries: $python has no torch; library resolution not checked (PYTHON=... to check)"
fi
