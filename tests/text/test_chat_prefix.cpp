// Prefix stability: a turn's prompt followed by what the model generated (parsed, then echoed
// back with its raw text) is a byte prefix of the next turn's prompt.
#include <gtest/gtest.h>

#include "dsa/text/chat.h"
#include "dsa/text/tool_calls.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;
const std::string kEos = "<｜end▁of▁sentence｜>";

const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "bash",
  "description": "Run a command.", "parameters": {"type": "object",
  "properties": {"command": {"type": "string"}, "opts": {"type": "object"}}}}}])");

// A conversation driven turn by turn: render, "generate", parse, append, render again.
class Session {
 public:
  Session(ChatFormat format, bool thinking, bool with_tools, bool drop_thinking = true)
      : format_(format), thinking_(thinking) {
    body_["messages"] = Json::array({{{"role", "system"}, {"content", "Be brief."}}});
    if (with_tools) body_["tools"] = kTools;
    body_["thinking"] = thinking;
    body_["chat_template_kwargs"] = {{"drop_thinking", drop_thinking}};
  }
  void add(Json message) { body_["messages"].push_back(std::move(message)); }
  std::string prompt() const { return render_chat(parse_chat_request(body_), format_); }
  // Appends the model's turn and returns prompt + generated + EOS: what the cache holds.
  std::string generate(const std::string& generated) {
    const std::string held = prompt() + generated + kEos;
    last_ = parse_completion(generated, ToolCallParserOptions{thinking_, {}});
    add(last_.assistant_message());
    return held;
  }
  const ParsedCompletion& last() const { return last_; }
  Json& body() { return body_; }

 private:
  Json body_;
  ChatFormat format_;
  bool thinking_;
  ParsedCompletion last_;
};

Json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }
Json tool_result(const std::string& id, const std::string& text) {
  return {{"role", "tool"}, {"tool_call_id", id}, {"content", text}};
}

// The model writes its JSON value without spaces: re-encoding the parsed call would not give
// these bytes back, the raw text does.
const std::string kCallV32 =
    "Looking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"bash\">\n"
    "<｜DSML｜parameter name=\"command\" string=\"true\">ls -1 src</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"all\":true,\"depth\":2}"
    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

std::string v4_call(const std::string& v32) {
  std::string s = v32;
  for (size_t at; (at = s.find("function_calls")) != std::string::npos;) {
    s.replace(at, 14, "tool_calls");
  }
  return s;
}

TEST(ChatPrefix, ChatModeAcrossUserTurns) {
  for (ChatFormat format : {ChatFormat::kV32, ChatFormat::kV4}) {
    Session s(format, /*thinking=*/false, /*with_tools=*/false);
    s.add(user("Hi"));
    const std::string held1 = s.generate("Hello! 👋");
    s.add(user("Bye"));
    const std::string p2 = s.prompt();
    EXPECT_EQ(p2.substr(0, held1.size()), held1) << chat_format_name(format);
    const std::string held2 = s.generate("Goodbye.");
    s.add(user("Again"));
    EXPECT_EQ(s.prompt().substr(0, held2.size()), held2) << chat_format_name(format);
  }
}

TEST(ChatPrefix, ThinkingToolLoopKeepsTheGeneratedBytes) {
  for (ChatFormat format : {ChatFormat::kV32, ChatFormat::kV4}) {
    SCOPED_TRACE(std::string(chat_format_name(format)));
    const std::string call = format == ChatFormat::kV32 ? kCallV32 : v4_call(kCallV32);
    Session s(format, /*thinking=*/true, /*with_tools=*/true);
    s.add(user("What is in src?"));
    const std::string held1 = s.generate("I should list it.</think>" + call);
    ASSERT_EQ(s.last().tool_calls.size(), 1u);
    EXPECT_EQ(s.last().tool_calls[0].arguments,
              R"({"command": "ls -1 src", "opts": {"all":true,"depth":2}})");
    s.add(tool_result(s.last().tool_calls[0].id, "a.cpp\nb.cpp"));
    const std::string p2 = s.prompt();
    EXPECT_EQ(p2.substr(0, held1.size()), held1);

    // Without the raw text the call re-renders canonically, which is not what was generated.
    Json plain = s.body();
    plain["messages"][2].erase(std::string(kRawCompletionKey));
    EXPECT_NE(render_chat(parse_chat_request(plain), format).substr(0, held1.size()), held1);

    const std::string held2 = s.generate("Two files.</think>There are two files: a.cpp, b.cpp.");
    s.add(user("Thanks"));
    if (format == ChatFormat::kV4) {  // with tools, V4 keeps every turn's reasoning
      EXPECT_EQ(s.prompt().substr(0, held2.size()), held2);
    }
  }
}

TEST(ChatPrefix, V4KeepsEarlierReasoningWhenAskedOrWithTools) {
  for (bool tools : {false, true}) {
    Session s(ChatFormat::kV4, /*thinking=*/true, tools, /*drop_thinking=*/tools);
    s.add(user("One"));
    const std::string held = s.generate("Think one.</think>Answer one.");
    s.add(user("Two"));
    EXPECT_EQ(s.prompt().substr(0, held.size()), held) << "tools " << tools;
  }
  // With the default drop-thinking and no tools, the format itself rewrites the earlier turn.
  Session s(ChatFormat::kV4, /*thinking=*/true, /*with_tools=*/false);
  s.add(user("One"));
  const std::string held = s.generate("Think one.</think>Answer one.");
  s.add(user("Two"));
  EXPECT_NE(s.prompt().substr(0, held.size()), held);
  EXPECT_EQ(s.prompt().find("Think one."), std::string::npos);
}

TEST(ChatPrefix, RawTextReplacesContentAndCalls) {
  const Json body = Json::parse(R"({"messages": [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "ignored", "dsa_raw": "exact  bytes\n"},
    {"role": "user", "content": "y"}]})");
  const std::string p = render_chat(parse_chat_request(body), ChatFormat::kV32);
  EXPECT_NE(p.find("</think>exact  bytes\n<｜end▁of▁sentence｜><｜User｜>y"), std::string::npos);
  EXPECT_EQ(p.find("ignored"), std::string::npos);
}

}  // namespace
}  // namespace dsa::text
