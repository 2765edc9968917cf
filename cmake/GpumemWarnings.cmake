# Warnings are errors for gpumem's own code. Use gpumem_target_defaults(target) on every target.
function(gpumem_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Werror)
  if(GPUMEM_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE} -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${GPUMEM_SANITIZE})
  endif()
endfunction()
