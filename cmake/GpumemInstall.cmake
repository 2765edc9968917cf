# Install rules and the gpumem package config, all in one place (included once from the top-level
# CMakeLists.txt, after every module). A user's project writes
#
#   find_package(gpumem REQUIRED)                        # every installed component
#   find_package(gpumem REQUIRED COMPONENTS alloc)       # or only what it links
#   target_link_libraries(app PRIVATE gpumem::torch)     # or gpumem::alloc, gpumem::forensics_offline, ...
#
# Components (each a target gpumem::<component>, with its usage requirements: include directory,
# cxx_std_20, the libraries it needs):
#   alloc              libgpumem_alloc.a: the engine, SimSource, HostVmmSource, parse_config of the
#                      engine's keys
#   alloc_cuda         libgpumem_alloc_cuda.a: CudaVmmSource, CudaMallocSource (links cudart)
#   forensics_offline  libgpumem_forensics_offline.a: readers, snapshots, replay, reports
#   forensics_runtime  libgpumem_forensics_runtime.a: trace ring, observers, EngineForensics
#   torch              libgpumem_torch.so: the libtorch adapter, with the engine and the
#                      configuration parse inside (do not link gpumem::alloc next to it)
# gpumem::torch needs libtorch: gpumemConfig.cmake finds Torch when the torch component is asked
# for (or when no component is named).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GPUMEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpumem)

set(gpumem_components alloc forensics_offline forensics_runtime)
set(gpumem_install_targets gpumem_alloc gpumem_forensics_offline gpumem_forensics_runtime)
set(GPUMEM_PACKAGE_CUDA OFF)
if(TARGET gpumem_alloc_cuda)
  list(APPEND gpumem_components alloc_cuda)
  list(APPEND gpumem_install_targets gpumem_alloc_cuda)
  set(GPUMEM_PACKAGE_CUDA ON)
endif()
install(TARGETS ${gpumem_install_targets}
  EXPORT gpumemTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT gpumemTargets
  NAMESPACE gpumem::
  DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/allocator/include/gpumem
                  ${PROJECT_SOURCE_DIR}/forensics/offline/include/gpumem
                  ${PROJECT_SOURCE_DIR}/forensics/runtime/include/gpumem
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

set(GPUMEM_PACKAGE_TORCH OFF)
if(TARGET gpumem_torch)
  set(GPUMEM_PACKAGE_TORCH ON)
  # The .so finds libtorch where it was built against it (the wheel's lib/); the install keeps the
  # link-time paths as RPATH.
  set_target_properties(gpumem_torch PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS gpumem_torch
    EXPORT gpumemTorchTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT gpumemTorchTargets
    NAMESPACE gpumem::
    DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/torch/include/gpumem
                    ${PROJECT_SOURCE_DIR}/forensics/runtime/torch/include/gpumem
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    FILES_MATCHING PATTERN "*.h")
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gpumemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/gpumemConfig.cmake
  INSTALL_DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gpumemConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gpumemConfig.cmake
              ${PROJECT_BINARY_DIR}/gpumemConfigVersion.cmake
  DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
