# Warnings are errors for gpumem's own code. Use gpumem_target_defaults(target) on every target.
function(gpumem_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  # GCC 12 reports false -Wrestrict positives inside std::string at -O3 (GCC PR 105329).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(GPUMEM_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE} -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE})
  endif()
endfunction()
