// The logits of one eager prefill step of a prompt through a fresh model, cache and runner: what
// the model-level tests compare between two sets of weights (a checkpoint's load and its source,
// fp8 weights and their bf16 dequantization).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "dsa/runner.h"

namespace dsa {

inline std::vector<float> prefill_logits(Backend& be, const ModelConfig& config, Weights w,
                                         const std::vector<int32_t>& prompt) {
  Model model(be, config, std::move(w), 16, 128);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = 4;
  KvCache cache(be, cc);
  Runner runner(model, cache, {});
  PageTable pages;
  EXPECT_TRUE(pages.reserve(16, cache.allocator()));
  std::vector<RowInput> rows;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int32_t pos = int32_t(i);
    rows.push_back({prompt[i], pos, pages.slot(pos), pos + 1, pages.pages()});
  }
  StepResult r = runner.step_eager(rows, StepOutputs().with_logits());
  pages.release_all(cache.allocator());
  return r.logits;
}

}  // namespace dsa
