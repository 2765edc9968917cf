# Finds gpumem's dependencies the standard way. scripts/setup.sh installs them.
find_package(fmt REQUIRED)
find_package(Boost 1.74 REQUIRED)   # Intrusive is header-only
find_package(ZLIB REQUIRED)         # gzip trace files
find_package(Threads REQUIRED)

# CUDA: headers and cudart for the CUDA memory sources. The driver (libcuda) is never linked:
# its entry points are resolved at run time so binaries load on machines without a GPU.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  message(STATUS "gpumem: CUDA toolkit ${CUDAToolkit_VERSION} at ${CUDAToolkit_LIBRARY_ROOT}")
else()
  message(STATUS "gpumem: no CUDA toolkit; the CUDA memory sources are left out")
endif()

if(GPUMEM_WITH_TESTS)
  find_package(Catch2 REQUIRED)
  message(STATUS "gpumem: Catch2 ${Catch2_VERSION}")
endif()

# libtorch comes from the PyPI wheel (its share/cmake/Torch); scripts/setup.sh passes
# CMAKE_PREFIX_PATH. Torch-dependent targets are separate so the core builds fast.
set(GPUMEM_HAVE_TORCH OFF)
if(GPUMEM_WITH_TORCH)
  # The CUDA wheel's Torch config compiles and runs a CUDA program to detect the local GPU's
  # architecture unless TORCH_CUDA_ARCH_LIST is set, and that probe fails to configure with
  # CMake 3.25 + nvcc 13 ("CUDA20 dialect"). gpumem compiles no CUDA code: name the H200's.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND)
    set(GPUMEM_HAVE_TORCH ON)
    message(STATUS "gpumem: libtorch found at ${TORCH_INSTALL_PREFIX}")
  else()
    message(WARNING "gpumem: libtorch not found (set CMAKE_PREFIX_PATH to torch.utils.cmake_prefix_path); "
                    "torch-dependent targets are left out")
  endif()
endif()
