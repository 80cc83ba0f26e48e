// One generation as an HTTP thread serves it: the prompt checked against the model, the request
// handed to the engine thread, and its tokens turned into text and OpenAI deltas as they arrive.
// The same job serves streaming (one delta batch per wait) and non-streaming (all of them).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/channel.h"
#include "server/engine_loop.h"
#include "server/request_parse.h"
#include "server/text_stream.h"

namespace dsa::server {

// Turns final text into the response's shape: completions' {"text"} or chat's deltas.
class OutputShaper {
 public:
  virtual ~OutputShaper() = default;
  // New text; appends zero or more choice deltas (streaming form) to `deltas`.
  virtual void text(const std::string& t, std::vector<nlohmann::json>& deltas) = 0;
  // No more text: flushes anything held.
  virtual void finish(std::vector<nlohmann::json>& deltas) = 0;
  // The whole output, non-streaming: the choice's "text" or "message" field and value.
  virtual std::pair<std::string, nlohmann::json> whole() const = 0;
  // The first streamed delta of a choice ({"role": "assistant"} for chat), or null.
  virtual nlohmann::json opening() const { return nullptr; }
  virtual bool made_tool_calls() const { return false; }
};

// Completions: deltas {"text": ...}; the whole text under "text".
class TextShaper : public OutputShaper {
 public:
  void text(const std::string& t, std::vector<nlohmann::json>& deltas) override;
  void finish(std::vector<nlohmann::json>&) override {}
  std::pair<std::string, nlohmann::json> whole() const override { return {"text", all_}; }

 private:
  std::string all_;
};

// Checks the prompt's ids and length against the model and resolves max_tokens: 400 naming the
// prompt length and the context when the prompt (plus any max_tokens asked) does not fit.
RequestParams plan_request(const GenerationRequest& gen, const std::vector<int32_t>& prompt,
                           const ModelInfo& info, int default_max_tokens);

class GenerationJob {
 public:
  GenerationJob(EngineLoop& loop, std::shared_ptr<RequestChannel> channel,
                std::unique_ptr<OutputShaper> shaper, const text::Tokenizer& tokenizer,
                const GenerationRequest& gen, int prompt_tokens);

  // Waits (up to the timeout) for tokens or the end, and turns what came into deltas. Returns true
  // once the generation has ended (engine finished, or a stop string matched).
  bool advance(std::vector<nlohmann::json>& deltas, std::chrono::milliseconds timeout);
  bool ended() const { return ended_; }
  // The failure, when the engine failed the request.
  const std::optional<ApiError>& error() const { return error_; }
  // Tokens consumed so far (streamed or kept): the usage's completion_tokens.
  int completion_tokens() const { return int(ids_.size()); }
  const std::vector<int32_t>& token_ids() const { return ids_; }
  std::string finish_reason() const;
  nlohmann::json usage() const;
  OutputShaper& shaper() { return *shaper_; }
  // The client went away: the engine thread aborts the request (its pages are freed at once).
  void abandon();

 private:
  EngineLoop& loop_;
  std::shared_ptr<RequestChannel> channel_;
  std::unique_ptr<OutputShaper> shaper_;
  TextStream text_;
  GenerationRequest gen_;
  int prompt_tokens_;
  std::vector<int32_t> arrived_;  // from the channel, not yet consumed
  std::vector<int32_t> ids_;      // consumed
  std::optional<ChannelFinal> final_;
  std::optional<ApiError> error_;
  bool ended_ = false, cancelled_ = false;
};

}  // namespace dsa::server
