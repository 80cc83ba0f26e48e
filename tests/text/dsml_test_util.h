// Helpers for the DSML parser tests: feed a text in given chunks and fold the deltas back into a
// ParsedCompletion, checking the delta stream's own rules on the way.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsa/text/tool_calls.h"

namespace dsa::text::testing {

inline constexpr std::string_view kDsmlMark = "｜DSML｜";

inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// The deltas of a stream, folded: what a client accumulates.
struct Folded {
  std::string content, reasoning;
  std::vector<ParsedToolCall> calls;
  std::string problem;  // a broken delta-stream rule, if any
};

inline void fold(Folded& f, const std::vector<ChatDelta>& deltas, bool check_utf8) {
  for (const ChatDelta& d : deltas) {
    if (d.kind != ChatDelta::Kind::kToolCallStart && d.text.empty()) f.problem = "empty delta";
    if (check_utf8 && !valid_utf8(d.text)) f.problem = "delta splits a UTF-8 character";
    switch (d.kind) {
      case ChatDelta::Kind::kReasoning:
        f.reasoning += d.text;
        break;
      case ChatDelta::Kind::kContent:
        f.content += d.text;
        break;
      case ChatDelta::Kind::kToolCallStart:
        if (d.index != int(f.calls.size())) f.problem = "call index out of order";
        f.calls.push_back({d.index, d.id, d.name, "", false});
        break;
      case ChatDelta::Kind::kToolCallArguments:
        if (f.calls.empty() || d.index != f.calls.back().index) {
          f.problem = "arguments for a call that is not the open one";
        } else {
          f.calls.back().arguments += d.text;
        }
        break;
    }
  }
}

// Feeds `text` cut at the given offsets (ascending) and returns the folded stream; the parser's
// own result is returned through *result.
inline Folded stream(std::string_view text, const std::vector<size_t>& cuts, bool thinking,
                     ParsedCompletion* result, bool check_utf8 = true) {
  ToolCallParser parser(ToolCallParserOptions{thinking, {}});
  Folded f;
  size_t from = 0;
  for (size_t cut : cuts) {
    fold(f, parser.feed(text.substr(from, cut - from)), check_utf8);
    from = cut;
  }
  fold(f, parser.feed(text.substr(from)), check_utf8);
  fold(f, parser.finish(), check_utf8);
  *result = parser.result();
  return f;
}

// The folded stream and the parser's result both equal the one-piece parse.
inline ::testing::AssertionResult same_as_whole(const Folded& f, const ParsedCompletion& got,
                                                const ParsedCompletion& whole) {
  auto fail = [](const std::string& what) { return ::testing::AssertionFailure() << what; };
  if (!f.problem.empty()) return fail(f.problem);
  if (f.content != whole.content) return fail("content differs: '" + f.content + "'");
  if (f.reasoning != whole.reasoning_content) return fail("reasoning differs");
  if (f.calls.size() != whole.tool_calls.size()) return fail("number of calls differs");
  for (size_t i = 0; i < f.calls.size(); ++i) {
    const auto& a = f.calls[i];
    const auto& b = whole.tool_calls[i];
    if (a.id != b.id || a.name != b.name) return fail("call header differs");
    if (a.arguments != b.arguments) return fail("arguments differ: " + a.arguments);
  }
  if (got.content != whole.content || got.reasoning_content != whole.reasoning_content ||
      got.raw != whole.raw || got.malformed_calls != whole.malformed_calls ||
      got.rejected_blocks != whole.rejected_blocks ||
      got.tool_calls.size() != whole.tool_calls.size()) {
    return fail("accumulated result differs");
  }
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    if (got.tool_calls[i].complete != whole.tool_calls[i].complete ||
        got.tool_calls[i].arguments != whole.tool_calls[i].arguments) {
      return fail("accumulated call differs");
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dsa::text::testing
