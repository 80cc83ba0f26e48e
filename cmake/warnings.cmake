# Warnings for host C++ targets. CUDA targets get their own flags in cuda.cmake.
function(dsa_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow -Wno-unused-parameter>)
endfunction()
