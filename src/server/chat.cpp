#include "server/chat.h"

#include <spdlog/spdlog.h>

#include "dsa/text/chat.h"
#include "dsa/text/tool_calls.h"

namespace dsa::server {

using nlohmann::json;
using nlohmann::ordered_json;

ChatPrompt render_chat_prompt(const text::Tokenizer& tokenizer, const std::string& body,
                              const ChatRequest& request) {
  ordered_json j = ordered_json::parse(body);  // already parsed once: valid JSON
  if (request.tool_choice == ToolChoice::kNone) {
    j.erase("tools");
  } else if (request.tool_choice == ToolChoice::kNamed) {
    ordered_json kept = ordered_json::array();
    for (const ordered_json& t : j["tools"]) {
      if (t["function"]["name"] == request.tool_choice_name) kept.push_back(t);
    }
    j["tools"] = std::move(kept);
  }
  const text::ChatRequest chat = text::parse_chat_request(j);
  ChatPrompt prompt;
  prompt.ids = tokenizer.encode(text::render_chat(chat, text::ChatFormat::kV32));
  prompt.thinking = chat.thinking;
  prompt.tools = chat.has_tools;
  return prompt;
}

namespace {

// Chat deltas from the per-request DSML parser. parallel_tool_calls: false keeps the first call
// and drops the rest (logged): without constrained decoding the model may still write several.
class ChatShaper : public OutputShaper {
 public:
  ChatShaper(const ChatRequest& request, const ChatPrompt& prompt, IdSource& ids)
      : parallel_(request.parallel_tool_calls),
        parser_(
            text::ToolCallParserOptions{prompt.thinking, [prefix = ids.next("call_")](int index) {
                                          return fmt::format("{}_{}", prefix, index);
                                        }}) {}

  void text(const std::string& t, std::vector<json>& deltas) override {
    take(parser_.feed(t), deltas);
  }
  void finish(std::vector<json>& deltas) override { take(parser_.finish(), deltas); }

  std::pair<std::string, json> whole() const override {
    const text::ParsedCompletion& r = parser_.result();
    json message = {{"role", "assistant"}, {"content", nullptr}};
    if (!r.content.empty() || r.tool_calls.empty()) message["content"] = r.content;
    if (!r.reasoning_content.empty()) message["reasoning_content"] = r.reasoning_content;
    if (!r.tool_calls.empty()) {
      json calls = json::array();
      for (const text::ParsedToolCall& c : r.tool_calls) {
        if (!parallel_ && c.index > 0) continue;
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    // The exact generated text, so a client that echoes the message back re-renders these bytes.
    message[std::string(text::kRawCompletionKey)] = r.raw;
    return {"message", message};
  }
  json opening() const override { return {{"role", "assistant"}, {"content", ""}}; }
  bool made_tool_calls() const override { return !parser_.result().tool_calls.empty(); }

 private:
  void take(const std::vector<text::ChatDelta>& pieces, std::vector<json>& deltas) {
    for (const text::ChatDelta& d : pieces) {
      const bool call = d.kind == text::ChatDelta::Kind::kToolCallStart ||
                        d.kind == text::ChatDelta::Kind::kToolCallArguments;
      if (call && !parallel_ && d.index > 0) {
        if (!warned_)
          spdlog::warn("serve: parallel_tool_calls is false: dropping tool call {}", d.index);
        warned_ = true;
        continue;
      }
      deltas.push_back(json::parse(d.openai().dump()));
    }
  }

  bool parallel_;
  bool warned_ = false;
  text::ToolCallParser parser_;
};

}  // namespace

std::unique_ptr<OutputShaper> make_chat_shaper(const ChatRequest& request, const ChatPrompt& prompt,
                                               IdSource& ids) {
  return std::make_unique<ChatShaper>(request, prompt, ids);
}

}  // namespace dsa::server
