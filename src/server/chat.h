// Chat requests over the text layer: the messages and tools rendered into the DeepSeek-V3.2
// prompt, and the generated text parsed back into content, reasoning_content and tool calls,
// with one parser per request (never shared).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsa/text/tokenizer.h"
#include "server/generation.h"
#include "server/ids.h"
#include "server/request_parse.h"

namespace dsa::server {

struct ChatPrompt {
  std::vector<int32_t> ids;
  bool thinking = false;  // the prompt opened a <think> block
  bool tools = false;     // tools were offered: the output may carry tool calls
};

// Renders the chat request (the body's text, parsed by the text layer with its key order kept)
// into prompt ids. tool_choice "none" renders no tools; a named tool renders only that one.
ChatPrompt render_chat_prompt(const text::Tokenizer& tokenizer, const std::string& body,
                              const ChatRequest& request);

std::unique_ptr<OutputShaper> make_chat_shaper(const ChatRequest& request, const ChatPrompt& prompt,
                                               IdSource& ids);

}  // namespace dsa::server
