# Sourced by every scripts/gpu/*.sh: the environment of a GPU run that uses binaries built on the
# CPU machine (scripts/gpu/stage.sh) instead of compiling on the GPU machine.
#
#   BUILD   the staged build tree (default .gpu/build; unpacked from .gpu/build.tar.xz if needed)
#   PY      the python that has torch (default python3)
# Exports LD_LIBRARY_PATH (BUILD/lib: libraries the GPU machine lacks; BUILD/torch: libgpumem_torch.so,
# which the test and bench binaries link by a CPU-machine path; torch's lib directory; the
# torch wheel's nvidia/*/lib: the binaries need libcudart.so.13 themselves), the NVLink multicast
# settings that must stay off, and GPUMEM_SOURCE_DIR.
gpu_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$gpu_root/.gpu/build}
PY=${PY:-python3}
# Unpacked again whenever the carried archive is newer than the last unpacking (a warm GPU machine
# keeps the ignored .gpu/build of an earlier call).
staged=$gpu_root/.gpu/build.tar.xz
if [ "$BUILD" = "$gpu_root/.gpu/build" ] && [ -f "$staged" ] &&
   { [ ! -f "$BUILD/.unpacked" ] || [ "$staged" -nt "$BUILD/.unpacked" ]; }; then
  rm -rf "$BUILD" && mkdir -p "$BUILD" && tar xJf "$staged" -C "$BUILD" && touch "$BUILD/.unpacked"
fi
if [ -z "${GPUMEM_GPU_ENV_DONE:-}" ]; then
  gpu_libs=$("$PY" - <<'PYEOF'
import glob, importlib.util, os
spec = importlib.util.find_spec("torch")
if spec and spec.submodule_search_locations:
    t = spec.submodule_search_locations[0]
    print(":".join([os.path.join(t, "lib")] + sorted(glob.glob(os.path.join(os.path.dirname(t), "nvidia", "*", "lib")))))
PYEOF
)
  export LD_LIBRARY_PATH="$BUILD/lib:$BUILD/torch:${gpu_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export GPUMEM_GPU_ENV_DONE=1
fi
export BUILD PY
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUMEM_SOURCE_DIR=$gpu_root
