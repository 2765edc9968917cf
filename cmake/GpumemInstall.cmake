# Install rules and the gpumem package config, so a user's project can write
#
#   find_package(gpumem REQUIRED)          # finds Torch (and CUDA) too
#   target_link_libraries(app PRIVATE gpumem::torch)
#
# Installed: libgpumem_torch.so (lib/), the headers of gpumem::alloc and gpumem::torch (include/),
# and lib/cmake/gpumem/{gpumemConfig,gpumemConfigVersion,gpumemTargets}.cmake.
# Included from allocator/torch/CMakeLists.txt once the gpumem_torch target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GPUMEM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/gpumem)

# The .so finds libtorch where it was built against it (the wheel's lib/); the install keeps the
# link-time paths as RPATH.
set_target_properties(gpumem_torch PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(TARGETS gpumem_torch
  EXPORT gpumemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/allocator/include/gpumem
                  ${PROJECT_SOURCE_DIR}/allocator/torch/include/gpumem
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT gpumemTargets
  NAMESPACE gpumem::
  DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/gpumemConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/gpumemConfig.cmake
  INSTALL_DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gpumemConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gpumemConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/gpumemConfigVersion.cmake
  DESTINATION ${GPUMEM_INSTALL_CMAKEDIR})
