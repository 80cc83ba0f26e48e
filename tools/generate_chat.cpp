#include "generate_chat.h"

#include <fstream>
#include <sstream>

#include "dsa/error.h"

namespace dsa::tools {

ChatPrompt read_chat_prompt(const std::string& path, const std::string& format_name) {
  std::ifstream in(path, std::ios::binary);
  require(bool(in), ErrorCode::kInvalidArgument, "--chat: cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  ChatPrompt p;
  p.format = text::parse_chat_format(format_name);
  try {
    p.request = text::parse_chat_request(std::string_view(ss.str()));
  } catch (const Error& e) {
    throw Error(e.code(), "--chat " + path + ": " + e.what());
  }
  p.text = text::render_chat(p.request, p.format);
  return p;
}

nlohmann::ordered_json chat_result_json(const ChatPrompt& prompt, const std::string& generated,
                                        bool hit_token_limit) {
  const text::ParsedCompletion r =
      text::parse_completion(generated, text::ToolCallParserOptions{prompt.request.thinking, {}});
  nlohmann::ordered_json out;
  out["content"] = r.content;
  if (prompt.request.thinking) out["reasoning_content"] = r.reasoning_content;
  if (prompt.request.has_tools) {
    out["tool_calls"] = nlohmann::ordered_json::array();
    for (const auto& c : r.tool_calls) {
      out["tool_calls"].push_back({{"id", c.id},
                                   {"type", "function"},
                                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
  }
  out["finish_reason"] = hit_token_limit ? "length" : std::string(r.finish_reason());
  if (r.malformed_calls > 0) out["malformed_calls"] = r.malformed_calls;
  if (r.rejected_blocks > 0) out["rejected_blocks"] = r.rejected_blocks;
  return out;
}

}  // namespace dsa::tools
