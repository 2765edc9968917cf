# Compile settings of gpumem's own targets. Use gpumem_target_defaults(target) on every target.
# Warnings are on everywhere; GPUMEM_WERROR=ON (CI: scripts/test.sh) makes them errors.
function(gpumem_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(GPUMEM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
    # GCC 12 and 13 report false -Wrestrict / -Warray-bounds / -Wstringop-overflow positives at -O3
    # inside the standard library when inlined into our code (GCC PRs 105329, 107852), e.g. from
    # std::vector<bool> in libtorch's custom_function.h: they stay warnings, never errors.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -Wno-error=array-bounds -Wno-error=stringop-overflow)
    endif()
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(GPUMEM_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE} -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE})
  endif()
endfunction()
