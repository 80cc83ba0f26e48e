// DeepSeek chat encoding: an OpenAI-style chat request rendered into the exact prompt text of
// DeepSeek's own Python encoders (encoding_dsv32.py for V3.2, encoding_dsv4.py for V4).
//
// From request to prompt:
//   ChatRequest req = parse_chat_request(body);     // validates; errors name the field
//   std::string prompt = render_chat(req, ChatFormat::kV32);
//   ids = tokenizer.encode(prompt);                 // special tokens in the text are matched
//
// The request mapping (the encoders take message lists, not requests):
//   - request-level "tools" go onto a leading system/developer message, or onto a new empty
//     system message in front of the conversation;
//   - "content" may be a string, null, or a list of {"type": "text", "text": S} parts, which are
//     joined by a blank line ("\n\n");
//   - thinking comes from "thinking" (bool or {"type": "enabled"|"disabled"}) or
//     "chat_template_kwargs": {"thinking"|"enable_thinking": bool}; off by default;
//     "chat_template_kwargs": {"drop_thinking": false} keeps earlier turns' reasoning;
//     "reasoning_effort": "max" adds V4's maximum-effort preface; "none" turns thinking off;
//   - a tool call's "function.arguments" is a JSON object text (an object is taken as its text).
//   - the request-level "response_format" is not rendered; a system/developer message may carry
//     its own "response_format", which is, as the encoders do.
//
// Prefix stability. An assistant message may carry kRawCompletionKey: the exact text the model
// generated for that turn after its reasoning (everything after "</think>" in thinking mode, all
// of it in chat mode), without the end-of-sentence token. When present it is rendered in place of
// "content" and "tool_calls", so the turn re-renders to the bytes the model produced, and the
// prompt of turn k followed by its completion is a byte prefix of the prompt of turn k+1 in chat
// mode, inside a tool-call loop, and across user turns whenever earlier reasoning is kept (V4
// with tools or with drop_thinking off). (V3.2 in thinking mode rewrites earlier user turns'
// "<think>" to "</think>" and drops their reasoning: that is the format, not a choice here.)
// ToolCallParser::assistant_message() fills the key.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::text {

enum class ChatFormat {
  kV32,  // DeepSeek-V3.2: <｜DSML｜function_calls>, tool results as <function_results>
  kV4,   // DeepSeek-V4: <｜DSML｜tool_calls>, tool results folded into the next user turn
};
ChatFormat parse_chat_format(std::string_view name);  // "v32" | "v4"
std::string_view chat_format_name(ChatFormat format);

enum class ReasoningEffort { kDefault, kHigh, kMax };

inline constexpr std::string_view kRawCompletionKey = "dsa_raw";

enum class Role { kSystem, kDeveloper, kUser, kAssistant, kTool, kLatestReminder };
std::string_view role_name(Role role);

struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object, as the client sent it
};

struct ChatMessage {
  Role role = Role::kUser;
  std::optional<std::string> content;  // nullopt: absent or null
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;
  std::vector<nlohmann::ordered_json> tools;  // the "function" objects, for system/developer
  std::optional<nlohmann::ordered_json> response_format;
  std::optional<std::string> raw;   // kRawCompletionKey (assistant)
  std::optional<std::string> task;  // V4 quick-instruction task: action, query, authority, ...
  bool wo_eos = false;              // V4: an assistant turn left open (no end-of-sentence)
};

struct ChatRequest {
  std::vector<ChatMessage> messages;  // request tools already attached (see above)
  bool thinking = false;
  bool drop_thinking = true;
  ReasoningEffort reasoning_effort = ReasoningEffort::kDefault;
  bool has_tools = false;  // the request offered tools: its output may carry tool calls
};

// Validates and converts a request body. Key order is kept (tool schemas render in the order the
// client wrote them), so parse the body as ordered_json, or pass the text. Bad input throws
// dsa::Error (kInvalidArgument) naming the field, e.g. "messages[2].role".
ChatRequest parse_chat_request(const nlohmann::ordered_json& body);
ChatRequest parse_chat_request(std::string_view body);

// The prompt text, beginning with the begin-of-sentence token unless add_bos is false.
std::string render_chat(const ChatRequest& request, ChatFormat format, bool add_bos = true);

// The tool-call block of one assistant turn as the encoder writes it ("\n\n" included), for a
// turn without kRawCompletionKey. Throws (naming messages[index]...) on unparsable arguments.
std::string render_tool_calls(const std::vector<ChatToolCall>& calls, ChatFormat format,
                              size_t message_index);

}  // namespace dsa::text
