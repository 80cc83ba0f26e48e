# One CMake library per room. dsa_room(NAME [DEPENDS targets...]) builds src/NAME/**/*.cpp into
# dsa_NAME with include/NAME as its public include directory and the listed rooms (and libraries)
# as its only public dependencies. Private headers are included as "NAME/file.h" from src/.
set(DSA_ROOMS core layout backend cache model runtime diagnostics text server python)

# Refuses an include of another room's private header ("other/...h" from src/). Public headers are
# enforced by the include directories themselves. Runs at every build (target dsa_check_rooms,
# cmake/check_rooms.cmake), before any room compiles.
function(dsa_check_room_includes src_root room)
  file(GLOB_RECURSE sources ${src_root}/${room}/*)
  foreach(source IN LISTS sources)
    file(STRINGS ${source} includes REGEX "^#include \"[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" target_room "${line}")
      if(target_room IN_LIST DSA_ROOMS AND NOT target_room STREQUAL room)
        message(FATAL_ERROR "${source}: '${line}' reaches into room '${target_room}' from room "
                            "'${room}'; include its public dsa/ header instead")
      endif()
    endforeach()
  endforeach()
endfunction()

function(dsa_room room)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${room}/*.cpp)
  list(FILTER sources EXCLUDE REGEX "/src/backend/cuda/")
  add_library(dsa_${room} STATIC ${sources})
  target_include_directories(dsa_${room} PUBLIC ${PROJECT_SOURCE_DIR}/include/${room}
                             PRIVATE ${PROJECT_SOURCE_DIR}/src)
  if(ARG_DEPENDS)
    target_link_libraries(dsa_${room} PUBLIC ${ARG_DEPENDS})
  endif()
  set_target_properties(dsa_${room} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  dsa_warnings(dsa_${room})
  add_dependencies(dsa_${room} dsa_check_rooms)
endfunction()

# In script mode (cmake -P) this file only defines the check.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  add_custom_target(dsa_check_rooms
    COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR}/src -P ${PROJECT_SOURCE_DIR}/cmake/check_rooms.cmake
    COMMENT "Checking that no room includes another room's private headers")
endif()
