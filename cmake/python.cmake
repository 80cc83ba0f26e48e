# Decides whether the Python module is built (DSA_PYTHON = ON | OFF | AUTO): it needs Python 3's
# headers (python3-dev) and pybind11 (pybind11-dev). Debian's /usr/bin/python3 is preferred over
# whatever `python3` comes first on PATH, so the module matches the interpreter that has numpy and
# pytest; `pip install ./python` passes its own interpreter as Python3_EXECUTABLE.
set(DSA_WITH_PYTHON OFF)
if(NOT DSA_PYTHON STREQUAL "OFF")
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(DSA_WITH_PYTHON ON)
  elseif(DSA_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "DSA_PYTHON=ON needs Python 3 headers (python3-dev) and pybind11 "
                        "(pybind11-dev); found Python3: ${Python3_FOUND}, pybind11: "
                        "${pybind11_FOUND}")
  endif()
endif()
message(STATUS "dsa: Python module ${DSA_WITH_PYTHON}")
