// Compiled against the backend room alone: its own ops and the layout room below it are visible.
#include "dsa/ops.h"
#include "dsa/token_codec.h"

int rooms_probe_downward() { return sizeof(dsa::PoolView) > 0 ? 0 : 1; }
