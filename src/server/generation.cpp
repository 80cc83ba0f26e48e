#include "server/generation.h"

#include <random>

namespace dsa::server {

using nlohmann::json;

void TextShaper::text(const std::string& t, std::vector<json>& deltas) {
  all_ += t;
  deltas.push_back({{"text", t}});
}

RequestParams plan_request(const GenerationRequest& gen, const std::vector<int32_t>& prompt,
                           const ModelInfo& info, int default_max_tokens) {
  const int64_t p = int64_t(prompt.size());
  const int64_t context = info.max_context;
  if (p >= context) {
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens, but the model's context holds {} "
                               "(prompt plus at least one generated token)",
                               p, context),
                   "messages", "context_length_exceeded");
  }
  RequestParams params;
  if (gen.max_tokens) {
    if (p + *gen.max_tokens > context) {
      throw ApiError(400,
                     fmt::format("the prompt has {} tokens and max_tokens is {}: {} tokens, but "
                                 "the model's context holds {}",
                                 p, *gen.max_tokens, p + *gen.max_tokens, context),
                     "max_tokens", "context_length_exceeded");
    }
    params.max_new_tokens = int(*gen.max_tokens);
  } else {
    params.max_new_tokens = int(std::min<int64_t>(default_max_tokens, context - p));
  }
  params.sampling = gen.sampling;
  if (!gen.seeded && !gen.sampling.greedy()) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    params.sampling.seed = rng();
  }
  if (!gen.ignore_eos && info.tokenizer && info.tokenizer->eos_id())
    params.stop_token = *info.tokenizer->eos_id();
  return params;
}

GenerationJob::GenerationJob(EngineLoop& loop, std::shared_ptr<RequestChannel> channel,
                             std::unique_ptr<OutputShaper> shaper, const text::Tokenizer& tokenizer,
                             const GenerationRequest& gen, int prompt_tokens)
    : loop_(loop),
      channel_(std::move(channel)),
      shaper_(std::move(shaper)),
      text_(tokenizer, gen.stop),
      gen_(gen),
      prompt_tokens_(prompt_tokens) {}

bool GenerationJob::advance(std::vector<json>& deltas, std::chrono::milliseconds timeout) {
  if (ended_) return true;
  if (!final_) final_ = channel_->wait(arrived_, timeout);
  size_t used = 0;
  for (; used < arrived_.size() && !text_.stopped(); ++used) {
    ids_.push_back(arrived_[used]);
    const std::string t = text_.push(arrived_[used]);
    if (!t.empty()) shaper_->text(t, deltas);
  }
  arrived_.erase(arrived_.begin(), arrived_.begin() + long(used));
  if (text_.stopped()) {
    if (!final_ && !cancelled_) {  // the engine may still be generating: stop it
      loop_.cancel(channel_, CancelReason::kStopString);
      cancelled_ = true;
    }
    shaper_->finish(deltas);
    ended_ = true;
  } else if (final_ && arrived_.empty()) {
    if (final_->error) {
      error_ = final_->error;
    } else {
      const std::string t = text_.finish();
      if (!t.empty()) shaper_->text(t, deltas);
      shaper_->finish(deltas);
    }
    ended_ = true;
  }
  return ended_;
}

void GenerationJob::abandon() {
  if (!final_ && !cancelled_) {
    loop_.cancel(channel_, CancelReason::kClientGone);
    cancelled_ = true;
  }
}

std::string GenerationJob::finish_reason() const {
  if (shaper_->made_tool_calls()) return "tool_calls";
  if (text_.stopped()) return "stop";
  if (final_ && final_->reason == FinishReason::kLength) return "length";
  return "stop";
}

json GenerationJob::usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens()},
          {"total_tokens", prompt_tokens_ + completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", final_ ? final_->cached_tokens : 0}}}};
}

}  // namespace dsa::server
