// Fills a pool with random tokens for benchmarks, through the backend's guarded store ops (the
// one writer per layout): every slot outside page 0 gets a valid token, page 0 stays zero.
#pragma once

#include <cstdint>

#include "dsa/backend.h"

namespace dsa {

void fill_pool_random(Backend& backend, const PoolView& pool, PoolKind kind, uint64_t seed);

}  // namespace dsa
