// Greedy generation of one request through a runner: chunked prefill, then decode.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsa/runner.h"

namespace dsa {

// Byte-level tokens: each byte of the text is one token in [0, 256).
std::vector<int32_t> byte_tokens(std::string_view text);
std::string byte_text(std::span<const int32_t> tokens);  // non-printable bytes as \xNN

// The token with the largest logit; ties go to the lower id. NaN never wins.
int32_t argmax(std::span<const float> logits);

struct GenerateStats {
  int prompt_tokens = 0;
  int new_tokens = 0;
  int steps = 0;
  int32_t store_errors = 0;
};

// Prefills `prompt` (chunks of at most the model's max_rows) and decodes up to max_new_tokens
// greedily, stopping early at stop_token (>= 0). Pages are reserved up front and always released.
// Throws kOutOfRange when prompt + max_new_tokens exceeds the model's context, and
// kResourceExhausted when the cache cannot hold them.
std::vector<int32_t> generate_greedy(Runner& runner, KvCache& cache, const Model& model,
                                     std::span<const int32_t> prompt, int max_new_tokens,
                                     int32_t stop_token = -1, GenerateStats* stats = nullptr);

}  // namespace dsa
