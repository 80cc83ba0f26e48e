# Decides whether the CUDA backend is built (DSA_CUDA = ON | OFF | AUTO) and holds its flags.
# The kernels target Hopper only: sm_90a, for wgmma and the bulk tensor copy engine.
set(DSA_WITH_CUDA OFF)
if(NOT DSA_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(DSA_WITH_CUDA ON)
  elseif(DSA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DSA_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "dsa: CUDA backend ${DSA_WITH_CUDA}")

if(DSA_WITH_CUDA)
  # CMake before 3.26 knows no C++20 dialect flag for nvcc; nvcc >= 12 accepts -std=c++20.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()

function(dsa_cuda_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
      -lineinfo -Xptxas=-warn-spills -Xcompiler=-Wall>
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                        POSITION_INDEPENDENT_CODE ON)
endfunction()
