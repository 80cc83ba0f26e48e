// The fixed text of DeepSeek's chat formats: special tokens, DSML tag names and the tools
// preamble of each version. One table per format; the renderer and the parser read only these.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dsa/text/chat.h"

namespace dsa::text {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderToken = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

struct ChatFormatSpec {
  ChatFormat format;
  std::string_view calls_block;  // the envelope's tag name: <｜DSML｜{calls_block}>
  // The tools preamble: the text before the schemas (one JSON object per line) and after them.
  std::string_view tools_head;
  std::string_view tools_tail;
};

const ChatFormatSpec& chat_format_spec(ChatFormat format);

// The tools preamble with the given function objects, as the encoder of `format` writes it.
std::string render_tools_block(const std::vector<nlohmann::ordered_json>& tools, ChatFormat format);

// The text after "<｜Assistant｜>" that opens (thinking) or skips (chat) the reasoning.
inline std::string_view think_token(bool open) { return open ? kThinkOpen : kThinkClose; }

}  // namespace dsa::text
