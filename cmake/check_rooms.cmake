cmake_policy(VERSION 3.25)
# cmake -DSRC=<repo>/src -P check_rooms.cmake: the room check over every room (see rooms.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/rooms.cmake)
foreach(room IN LISTS DSA_ROOMS)
  dsa_check_room_includes(${SRC} ${room})
endforeach()
