// Compiled against the backend room alone: the engine belongs to the runtime room, above it, so
// this include must not be found. The rooms.upward_include test expects this build to fail.
#include "dsa/engine.h"

int rooms_probe_upward() { return 0; }
