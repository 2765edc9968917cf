# gpumem's private copy of jemalloc: a static PIC archive (scripts/stage_jemalloc.sh's build of
# Debian's source package, else Debian's libjemalloc-dev) with every public symbol renamed to
# gpumem_je_* and its C++ operator new/delete object left out, so linking it into a program or a
# shared library never replaces the process's malloc, free or operator new.
# See pinned/README.md ("jemalloc: where it comes from").
#
# Inputs (cache variables):
#   GPUMEM_JEMALLOC_ROOT   a folder with include/jemalloc/jemalloc.h and lib/libjemalloc_pic.a
#                          (scripts/stage_jemalloc.sh builds one; scripts/setup.sh passes it);
#                          empty = the system's (pkg-config jemalloc, then find_*).
# Outputs:
#   GPUMEM_JEMALLOC_FOUND  ON when the archive and header were found
#   GPUMEM_JEMALLOC_INITIAL_EXEC_TLS
#                          ON when the archive uses initial-exec TLS (Debian's binary package): a
#                          library carrying it cannot be dlopen'ed late without GLIBC_TUNABLES
#                          (pinned/README.md). OFF for scripts/stage_jemalloc.sh's build.
#   target gpumem_jemalloc_private (INTERFACE): the renamed archive, the header's folder, and the
#                          link option that keeps the archive's symbols local to a shared library.
set(GPUMEM_JEMALLOC_ROOT "" CACHE PATH "Folder with include/jemalloc/jemalloc.h and lib/libjemalloc_pic.a")
set(GPUMEM_JEMALLOC_FOUND OFF)

set(_je_hints "")
if(GPUMEM_JEMALLOC_ROOT)
  list(APPEND _je_hints ${GPUMEM_JEMALLOC_ROOT})
else()
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(GPUMEM_PC_JEMALLOC QUIET jemalloc)
    if(GPUMEM_PC_JEMALLOC_FOUND)
      list(APPEND _je_hints ${GPUMEM_PC_JEMALLOC_PREFIX})
    endif()
  endif()
endif()

# A static archive compiled as position-independent code: Debian ships it as libjemalloc_pic.a
# (libjemalloc.a is not PIC and cannot go into a shared library).
if(GPUMEM_JEMALLOC_ROOT)
  find_path(GPUMEM_JEMALLOC_INCLUDE_DIR jemalloc/jemalloc.h PATHS ${_je_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_file(GPUMEM_JEMALLOC_PIC_ARCHIVE libjemalloc_pic.a PATHS ${_je_hints}
            PATH_SUFFIXES lib lib64 lib/${CMAKE_LIBRARY_ARCHITECTURE} NO_DEFAULT_PATH)
else()
  find_path(GPUMEM_JEMALLOC_INCLUDE_DIR jemalloc/jemalloc.h HINTS ${_je_hints} PATH_SUFFIXES include)
  find_file(GPUMEM_JEMALLOC_PIC_ARCHIVE libjemalloc_pic.a HINTS ${_je_hints}
            PATH_SUFFIXES lib lib64 lib/${CMAKE_LIBRARY_ARCHITECTURE})
endif()

if(NOT GPUMEM_JEMALLOC_INCLUDE_DIR OR NOT GPUMEM_JEMALLOC_PIC_ARCHIVE)
  message(STATUS "gpumem: jemalloc not found (header: ${GPUMEM_JEMALLOC_INCLUDE_DIR}, archive: "
                 "${GPUMEM_JEMALLOC_PIC_ARCHIVE}); the pinned host allocator (gpumem::pinned) is left out. "
                 "Install Debian's libjemalloc-dev (scripts/setup.sh does), or set GPUMEM_JEMALLOC_ROOT to a "
                 "folder made by scripts/stage_jemalloc.sh.")
  return()
endif()

file(STRINGS ${GPUMEM_JEMALLOC_INCLUDE_DIR}/jemalloc/jemalloc.h _je_version_line REGEX "#define JEMALLOC_VERSION_(MAJOR|MINOR) ")
string(REGEX MATCH "MAJOR ([0-9]+)" _m "${_je_version_line}")
set(_je_major ${CMAKE_MATCH_1})
string(REGEX MATCH "MINOR ([0-9]+)" _m "${_je_version_line}")
set(_je_minor ${CMAKE_MATCH_1})
if(NOT _je_major EQUAL 5 OR _je_minor LESS 2)
  message(STATUS "gpumem: jemalloc ${_je_major}.${_je_minor} at ${GPUMEM_JEMALLOC_INCLUDE_DIR} is not 5.2 or newer 5.x; "
                 "the pinned host allocator (gpumem::pinned) is left out. Install Debian 12's libjemalloc-dev (5.3).")
  return()
endif()
if(NOT CMAKE_OBJCOPY OR NOT CMAKE_AR OR NOT CMAKE_READELF)
  message(STATUS "gpumem: objcopy, ar or readelf (binutils) not found; the pinned host allocator is left out.")
  return()
endif()

# Initial-exec TLS shows as TPOFF relocations (GOTTPOFF, TPOFF32/64); global-dynamic as TLSGD.
execute_process(COMMAND ${CMAKE_READELF} -rW ${GPUMEM_JEMALLOC_PIC_ARCHIVE} OUTPUT_VARIABLE _je_relocs RESULT_VARIABLE _je_rc)
if(NOT _je_rc EQUAL 0)
  message(STATUS "gpumem: ${CMAKE_READELF} -rW ${GPUMEM_JEMALLOC_PIC_ARCHIVE} failed; the pinned host allocator is left out.")
  return()
endif()
set(GPUMEM_JEMALLOC_INITIAL_EXEC_TLS OFF)
if(_je_relocs MATCHES "R_X86_64_(GOT)?TPOFF|R_AARCH64_TLSIE")
  set(GPUMEM_JEMALLOC_INITIAL_EXEC_TLS ON)
endif()
unset(_je_relocs)

set(_je_out ${CMAKE_CURRENT_BINARY_DIR}/libgpumem_jemalloc.a)
add_custom_command(
  OUTPUT ${_je_out}
  COMMAND ${CMAKE_COMMAND} -DINPUT=${GPUMEM_JEMALLOC_PIC_ARCHIVE} -DOUTPUT=${_je_out}
          -DOBJCOPY=${CMAKE_OBJCOPY} -DAR=${CMAKE_AR} -DREADELF=${CMAKE_READELF} -DPREFIX=gpumem_je_
          -P ${CMAKE_CURRENT_LIST_DIR}/rename_jemalloc.cmake
  DEPENDS ${GPUMEM_JEMALLOC_PIC_ARCHIVE} ${CMAKE_CURRENT_LIST_DIR}/rename_jemalloc.cmake
  COMMENT "Renaming jemalloc's public symbols to gpumem_je_* (private copy for gpumem::pinned)"
  VERBATIM)
add_custom_target(gpumem_jemalloc_archive DEPENDS ${_je_out})

add_library(gpumem_jemalloc_private INTERFACE)
add_dependencies(gpumem_jemalloc_private gpumem_jemalloc_archive)
target_include_directories(gpumem_jemalloc_private SYSTEM INTERFACE ${GPUMEM_JEMALLOC_INCLUDE_DIR})
# Shared libraries that take members of the archive keep its symbols local (--exclude-libs), so
# nothing of this copy is visible to, or interposed by, the rest of the process.
target_link_libraries(gpumem_jemalloc_private INTERFACE ${_je_out} Threads::Threads ${CMAKE_DL_LIBS} m)
target_link_options(gpumem_jemalloc_private INTERFACE "LINKER:--exclude-libs,libgpumem_jemalloc.a")
set(GPUMEM_JEMALLOC_FOUND ON)
if(GPUMEM_JEMALLOC_INITIAL_EXEC_TLS)
  set(_je_tls "initial-exec TLS: a late dlopen of libgpumem_pinned_torch.so needs GLIBC_TUNABLES; "
              "scripts/stage_jemalloc.sh builds one without")
else()
  set(_je_tls "global-dynamic TLS")
endif()
message(STATUS "gpumem: jemalloc ${_je_major}.${_je_minor} for pinned host memory: ${GPUMEM_JEMALLOC_PIC_ARCHIVE} "
               "(symbols renamed gpumem_je_*; ${_je_tls})")
