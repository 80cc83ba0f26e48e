// dsa generate --chat FILE: a chat request rendered into the prompt of a DeepSeek chat format,
// and the generated text parsed back into content, reasoning and tool calls.
#pragma once

#include <string>

#include "dsa/text/chat.h"
#include "dsa/text/tool_calls.h"

namespace dsa::tools {

struct ChatPrompt {
  text::ChatRequest request;
  text::ChatFormat format = text::ChatFormat::kV32;
  std::string text;  // the rendered prompt
};

// Reads and renders FILE (an OpenAI-style chat request body). Unreadable files, malformed JSON
// and bad fields are kInvalidArgument errors naming the file and the field.
ChatPrompt read_chat_prompt(const std::string& path, const std::string& format_name);

// The parsed generation as one JSON object: content, reasoning_content (thinking), tool_calls
// (with tools), finish_reason, and the malformed/rejected counts when not zero.
nlohmann::ordered_json chat_result_json(const ChatPrompt& prompt, const std::string& generated,
                                        bool hit_token_limit);

}  // namespace dsa::tools
