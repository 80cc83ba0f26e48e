cmake_policy(VERSION 3.25)
# Plants src/backend/probe.cpp including the runtime room's private header, then runs the room
# check over it; the check must stop with a message naming both rooms.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/rooms.cmake)
file(REMOVE_RECURSE ${ROOT})
file(WRITE ${ROOT}/backend/probe.cpp "#include \"runtime/engine_state.h\"\n")
file(WRITE ${ROOT}/backend/fine.cpp "#include \"backend/cpu/cpu_ops.h\"\n")
dsa_check_room_includes(${ROOT} backend)
message(STATUS "no cross-room include found")
