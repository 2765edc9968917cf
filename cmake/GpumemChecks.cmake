# Module boundaries, checked at configure time so that every build (CI's included) fails when one
# is crossed. See docs/ARCHITECTURE.md ("Module boundaries").
#
#   1. allocator/ depends on nothing of ours: no allocator source includes a header of another
#      module, and gpumem_alloc / gpumem_alloc_cuda link no other gpumem library.
#   2. The offline forensics library is usable without libtorch or CUDA: nothing in its link
#      closure is libtorch, c10 or a CUDA library.
#   3. A module's public headers are the only way in: no target's include directories name another
#      module's src/ directory (tests/<module>/ may include <module>/src: white-box tests of that
#      module's internals), and no library exports a src/ directory.

# Every target defined under dir, recursively.
function(_gpumem_targets_under dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _gpumem_targets_under("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The link closure of target: every library reached through LINK_LIBRARIES and
# INTERFACE_LINK_LIBRARIES, generator expressions ($<LINK_ONLY:x>, $<BUILD_INTERFACE:x>) opened.
function(_gpumem_link_closure target out)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue item)
    if(item IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${item})
    if(NOT TARGET ${item})
      continue()
    endif()
    get_target_property(type ${item} TYPE)
    set(libs "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${item} LINK_LIBRARIES)
      if(direct)
        list(APPEND libs ${direct})
      endif()
    endif()
    get_target_property(iface ${item} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND libs ${iface})
    endif()
    foreach(lib IN LISTS libs)
      string(REGEX REPLACE "^\\$<(LINK_ONLY|BUILD_INTERFACE):(.*)>$" "\\2" lib "${lib}")
      if(lib MATCHES "^\\$<" OR lib STREQUAL "")
        continue()  # $<INSTALL_INTERFACE:...> and other conditions: not part of this build's link
      endif()
      list(APPEND queue ${lib})
    endforeach()
  endwhile()
  list(REMOVE_ITEM seen ${target})
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(gpumem_check_module_boundaries)
  set(root ${PROJECT_SOURCE_DIR})

  # 1. allocator/ includes and links nothing of ours.
  file(GLOB_RECURSE alloc_files ${root}/allocator/*.h ${root}/allocator/*.cpp)
  foreach(file IN LISTS alloc_files)
    file(STRINGS ${file} hits REGEX "#[ \t]*include[ \t]*[\"<]gpumem/(forensics|torch|ckpt|zero|view)/")
    if(hits)
      file(RELATIVE_PATH rel ${root} ${file})
      message(FATAL_ERROR "gpumem module boundary: ${rel} includes ${hits}; allocator/ depends on nothing "
                          "of ours (the engine emits events; forensics and the torch adapter build on it)")
    endif()
  endforeach()
  foreach(target gpumem_alloc gpumem_alloc_cuda)
    if(TARGET ${target})
      _gpumem_link_closure(${target} closure)
      foreach(lib IN LISTS closure)
        if(lib MATCHES "^(gpumem|gpumem::)" AND NOT lib MATCHES "^(gpumem::)?gpumem_alloc$|^gpumem::alloc$")
          message(FATAL_ERROR "gpumem module boundary: ${target} links ${lib}; allocator/ depends on nothing of ours")
        endif()
      endforeach()
    endif()
  endforeach()

  # 2. The offline forensics library links neither libtorch nor CUDA.
  if(TARGET gpumem_forensics_offline)
    _gpumem_link_closure(gpumem_forensics_offline closure)
    foreach(lib IN LISTS closure)
      if(lib MATCHES "torch|c10|^CUDA::|cuda" OR lib IN_LIST TORCH_LIBRARIES)
        message(FATAL_ERROR "gpumem module boundary: gpumem_forensics_offline links ${lib}; the offline "
                            "forensics library must build and run without libtorch and CUDA")
      endif()
    endforeach()
  endif()

  # 3. Nobody includes another module's src/.
  _gpumem_targets_under(${root} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "UTILITY")
      continue()
    endif()
    get_target_property(target_dir ${target} SOURCE_DIR)
    file(RELATIVE_PATH target_rel ${root} ${target_dir})
    set(dirs "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(private ${target} INCLUDE_DIRECTORIES)
      if(private)
        list(APPEND dirs ${private})
      endif()
    endif()
    get_target_property(public ${target} INTERFACE_INCLUDE_DIRECTORIES)
    foreach(dir IN LISTS public)
      string(REGEX REPLACE "^\\$<BUILD_INTERFACE:(.*)>$" "\\1" dir "${dir}")
      if(dir MATCHES "(^|/)src(/|$)" AND dir MATCHES "^${root}/")
        message(FATAL_ERROR "gpumem module boundary: ${target} exports its src/ directory (${dir}); only "
                            "include/ is public")
      endif()
    endforeach()
    foreach(dir IN LISTS dirs)
      if(NOT dir MATCHES "^${root}/(.*)/src(/.*)?$")
        continue()
      endif()
      set(module ${CMAKE_MATCH_1})
      if(target_rel MATCHES "^${module}(/|$)" OR target_rel MATCHES "^tests/${module}(/|$)")
        continue()
      endif()
      # forensics/offline and forensics/runtime tests live together in tests/forensics/.
      if(module MATCHES "^forensics/" AND target_rel MATCHES "^tests/forensics(/|$)")
        continue()
      endif()
      message(FATAL_ERROR "gpumem module boundary: ${target} (${target_rel}) includes ${module}/src; use "
                          "${module}'s public headers (its include/ directory) instead")
    endforeach()
  endforeach()
endfunction()
