// The parser's results in OpenAI's shapes: an assistant message with its tool calls, and one
// streamed delta as a chat.completion.chunk's "delta" object.
#include <nlohmann/json.hpp>

#include "dsa/text/chat.h"
#include "dsa/text/tool_calls.h"

namespace dsa::text {

std::string_view ParsedCompletion::finish_reason() const {
  return tool_calls.empty() ? "stop" : "tool_calls";
}

nlohmann::ordered_json ParsedCompletion::assistant_message() const {
  nlohmann::ordered_json m;
  m["role"] = "assistant";
  m["content"] = content;
  if (thinking_closed || !reasoning_content.empty()) m["reasoning_content"] = reasoning_content;
  if (!tool_calls.empty()) {
    auto& calls = m["tool_calls"] = nlohmann::ordered_json::array();
    for (const auto& c : tool_calls) {
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
  }
  m[std::string(kRawCompletionKey)] = raw;
  return m;
}

nlohmann::ordered_json ChatDelta::openai() const {
  using J = nlohmann::ordered_json;
  switch (kind) {
    case Kind::kReasoning:
      return J{{"reasoning_content", text}};
    case Kind::kContent:
      return J{{"content", text}};
    case Kind::kToolCallStart:
      return J{{"tool_calls", J::array({J{{"index", index},
                                          {"id", id},
                                          {"type", "function"},
                                          {"function", {{"name", name}, {"arguments", ""}}}}})}};
    case Kind::kToolCallArguments:
      return J{
          {"tool_calls", J::array({J{{"index", index}, {"function", {{"arguments", text}}}}})}};
  }
  return J::object();
}

}  // namespace dsa::text
