cmake_policy(VERSION 3.25)
# cmake -DROOT=<repo> -DCLANG_FORMAT=<clang-format> -P check_format.cmake: every C++ and CUDA
# source of the project (src, include, tools, tests, bench) must already be formatted by the
# repository's .clang-format; the files that are not are named, with clang-format's diagnostics.
file(GLOB_RECURSE sources LIST_DIRECTORIES false
     ${ROOT}/src/*.cpp ${ROOT}/src/*.h ${ROOT}/src/*.cu ${ROOT}/src/*.cuh
     ${ROOT}/include/*.h ${ROOT}/tools/*.cpp ${ROOT}/tools/*.h
     ${ROOT}/tests/*.cpp ${ROOT}/tests/*.h ${ROOT}/bench/*.cpp ${ROOT}/bench/*.h)
list(LENGTH sources count)
if(count LESS 50)
  message(FATAL_ERROR "found only ${count} sources under ${ROOT}: wrong ROOT?")
endif()
set(unformatted "")
foreach(file IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run -Werror --style=file ${file}
                  RESULT_VARIABLE rc ERROR_VARIABLE diagnostics OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    file(RELATIVE_PATH name ${ROOT} ${file})
    list(APPEND unformatted ${name})
    message("${diagnostics}")
  endif()
endforeach()
if(unformatted)
  list(LENGTH unformatted n)
  list(JOIN unformatted "\n  " names)
  message(FATAL_ERROR "${n} of ${count} sources are not formatted (run clang-format -i on them):\n  ${names}")
endif()
message(STATUS "${count} sources formatted")
