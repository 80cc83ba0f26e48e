// Parsing and validation of OpenAI request bodies. Every problem is an ApiError (400, or 404 for
// an unknown model) naming the field; nothing here can throw anything else. The checks that need
// the loaded model (token ids against the vocabulary, lengths against the context) come later.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dsa/sampler.h"

namespace dsa::server {

// The sampling and streaming fields shared by /v1/completions and /v1/chat/completions.
struct GenerationRequest {
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens; none: default
  SamplingParams sampling;            // temperature (default 1), top_p, seed
  bool seeded = false;                // a seed was given (else the server draws one)
  std::vector<std::string> stop;      // stop strings, matched on the decoded text
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // an extension: the generated ids beside the text
  bool ignore_eos = false;        // an extension (as vLLM's): generate exactly max_tokens
};

struct CompletionRequest {
  GenerationRequest gen;
  std::optional<std::string> prompt_text;  // a string prompt
  std::vector<int64_t> prompt_ids;         // or token ids (checked against the vocab later)
};

enum class ToolChoice : uint8_t { kAuto, kNone, kRequired, kNamed };

// The server's own fields of a chat request; messages and tools are the text layer's to check.
struct ChatRequest {
  GenerationRequest gen;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;
};

// The body as JSON: 400 when it is not valid JSON (or not valid UTF-8) or not an object.
nlohmann::json parse_body(const std::string& body);
// 404 when the body names a model other than `served_model`.
void check_model(const nlohmann::json& body, const std::string& served_model);

CompletionRequest parse_completion_request(const nlohmann::json& body);
ChatRequest parse_chat_request(const nlohmann::json& body);

}  // namespace dsa::server
