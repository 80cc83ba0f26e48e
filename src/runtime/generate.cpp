#include "dsa/generate.h"

#include <cmath>

#include "dsa/error.h"

namespace dsa {

std::vector<int32_t> byte_tokens(std::string_view text) {
  std::vector<int32_t> t;
  t.reserve(text.size());
  for (unsigned char ch : text) t.push_back(ch);
  return t;
}

std::string byte_text(std::span<const int32_t> tokens) {
  std::string s;
  for (int32_t t : tokens) {
    if (t >= 0x20 && t < 0x7F) {
      s.push_back(char(t));
    } else if (t == '\n') {
      s += "\\n";
    } else {
      s += fmt::format("\\x{:02x}", t & 0xFF);
    }
  }
  return s;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = int32_t(i);
  }
  require(best >= 0, ErrorCode::kInternal, "every one of {} logits is NaN", logits.size());
  return best;
}

std::vector<int32_t> generate_greedy(Runner& runner, KvCache& cache, const Model& model,
                                     std::span<const int32_t> prompt, int max_new_tokens,
                                     int32_t stop_token, GenerateStats* stats) {
  const int64_t total = int64_t(prompt.size()) + max_new_tokens;
  require(!prompt.empty(), ErrorCode::kInvalidArgument, "the prompt is empty");
  require(max_new_tokens >= 1, ErrorCode::kInvalidArgument, "max_new_tokens = {} must be >= 1",
          max_new_tokens);
  require(total <= model.max_context(), ErrorCode::kOutOfRange,
          "prompt of {} tokens plus {} new tokens exceeds the context of {} tokens", prompt.size(),
          max_new_tokens, model.max_context());

  PageTable pages;
  require(pages.reserve(total, cache.allocator()), ErrorCode::kResourceExhausted,
          "the cache has {} free pages, {} tokens need {}", cache.allocator().free_pages(), total,
          (total + kPageSize - 1) / kPageSize);
  struct Release {  // pages go back however this function exits
    PageTable& t;
    PageAllocator& a;
    ~Release() { t.release_all(a); }
  } release{pages, cache.allocator()};

  GenerateStats st;
  st.prompt_tokens = int(prompt.size());
  auto row = [&](int32_t token, int32_t position) {
    return RowInput{token, position, pages.slot(position), position + 1, pages.pages()};
  };
  // Prefill: one row per prompt token; causality comes from each row's seq_len. Every row's token
  // is drawn greedily on the device; the last prompt row's is the first new token.
  int32_t next = -1;
  const int chunk = model.max_rows();
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    std::vector<RowInput> rows;
    for (size_t i = start; i < std::min(prompt.size(), start + chunk); ++i) {
      rows.push_back(row(prompt[i], int32_t(i)));
    }
    StepResult r = runner.step(rows);
    st.store_errors += r.store_errors;
    ++st.steps;
    next = r.tokens.back();
  }
  std::vector<int32_t> out;
  int32_t position = int32_t(prompt.size());
  for (int n = 0; n < max_new_tokens; ++n) {
    out.push_back(next);
    if (next == stop_token || n + 1 == max_new_tokens) break;
    const RowInput r = row(next, position++);
    StepResult res = runner.step({&r, 1});
    st.store_errors += res.store_errors;
    ++st.steps;
    next = res.tokens[0];
  }
  st.new_tokens = int(out.size());
  if (stats) *stats = st;
  return out;
}

}  // namespace dsa
