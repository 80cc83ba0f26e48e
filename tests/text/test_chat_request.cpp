// Request validation and mapping: bad input is refused with the field named; the request-level
// options land where the encoders expect them.
#include <gtest/gtest.h>

#include "dsa/error.h"
#include "dsa/text/chat.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;

// The message of the error that rendering or parsing `body` raises ("" when none).
std::string error_of(std::string_view body, ChatFormat format = ChatFormat::kV32) {
  try {
    render_chat(parse_chat_request(body), format);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(ChatRequest, BadInputNamesTheField) {
  struct Bad {
    const char* body;
    const char* names;
  };
  const Bad bad[] = {
      {R"({"messages": [)", "not valid JSON"},
      {R"([1, 2])", "must be a JSON object"},
      {R"({"messages": []})", "messages must not be empty"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})",
       "messages[0].role: unknown role 'robot'"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content must be"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": "object"}}]})",
       "tools[0].function.parameters must be a JSON schema object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {}}]})",
       "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}})",
       "tools must be a list"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})",
       "messages[0]: a tool result must follow"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]})",
       "messages[1].tool_calls[0].function.arguments is not valid JSON"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]})",
       "messages[1].tool_calls[0].function.arguments must be a JSON object"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
          "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}},
                         {"id": "b", "function": {"name": "g", "arguments": "{}"}}]},
          {"role": "tool", "content": "r"}]})",
       "only 1 tool result(s) follow an assistant message with 2 tool call(s)"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "messages[0].tool_calls is only allowed on assistant"},
      {R"({"messages": [{"role": "user", "content": "x"}], "thinking": "yes"})",
       "thinking must be"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})",
       "reasoning_effort: unknown value 'extreme'"},
      {R"({"messages": [{"role": "latest_reminder", "content": "x"}]})",
       "'latest_reminder' exists only in the v4 chat format"},
      {R"({"messages": [{"role": "user", "content": "x", "task": "dance"}]})",
       "messages[0].task: unknown task 'dance'"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
          "thinking": true})",
       "needs reasoning_content or tool_calls"},
  };
  for (const Bad& b : bad) {
    const std::string err = error_of(b.body);
    EXPECT_NE(err.find(b.names), std::string::npos) << b.body << "\n  error: " << err;
  }
  EXPECT_THROW(parse_chat_format("v5"), Error);
}

TEST(ChatRequest, V4AcceptsWhatItsEncoderAccepts) {
  // Unparsable arguments become one string parameter named "arguments", as the V4 encoder does.
  const std::string p = render_chat(
      parse_chat_request(std::string_view(R"({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
        "arguments": "{not json"}}]}]})")),
      ChatFormat::kV4);
  EXPECT_NE(
      p.find("<｜DSML｜parameter name=\"arguments\" string=\"true\">{not json</｜DSML｜parameter>"),
      std::string::npos);
  EXPECT_EQ(error_of(R"({"messages": [{"role": "latest_reminder", "content": "r"},
                        {"role": "user", "content": "x"}]})",
                     ChatFormat::kV4),
            "");
}

TEST(ChatRequest, OptionsAndToolPlacement) {
  const auto req = parse_chat_request(std::string_view(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "chat_template_kwargs": {"enable_thinking": true, "drop_thinking": false},
      "reasoning_effort": "max"})"));
  ASSERT_EQ(req.messages.size(), 2u);  // an empty system message carries the tools
  EXPECT_EQ(req.messages[0].role, Role::kSystem);
  EXPECT_FALSE(req.messages[0].content.has_value());
  ASSERT_EQ(req.messages[0].tools.size(), 1u);
  EXPECT_EQ(req.messages[1].content.value(), "a\n\nb");
  EXPECT_TRUE(req.thinking);
  EXPECT_FALSE(req.drop_thinking);
  EXPECT_TRUE(req.has_tools);
  EXPECT_EQ(req.reasoning_effort, ReasoningEffort::kMax);

  const auto off = parse_chat_request(std::string_view(
      R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"},
          "reasoning_effort": "none"})"));
  EXPECT_FALSE(off.thinking);
  const std::string chat = render_chat(off, ChatFormat::kV32);
  EXPECT_EQ(chat, "<｜begin▁of▁sentence｜><｜User｜>x<｜Assistant｜></think>");
  EXPECT_EQ(render_chat(off, ChatFormat::kV32, /*add_bos=*/false),
            "<｜User｜>x<｜Assistant｜></think>");
}

TEST(ChatRequest, ToolSchemasKeepTheClientsKeyOrder) {
  const auto req = parse_chat_request(std::string_view(R"({"messages": [
      {"role": "system", "content": "s"}, {"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "z", "parameters":
        {"type": "object", "properties": {"zeta": {"type": "number"}, "alpha": {"type": "string",
        "description": "ünï \"q\" \u0007"}}, "required": ["zeta"]}, "description": "d"}}]})"));
  const std::string p = render_chat(req, ChatFormat::kV4);
  EXPECT_NE(
      p.find(
          R"({"name": "z", "parameters": {"type": "object", "properties": {"zeta": {"type": "number"}, "alpha": {"type": "string", "description": "ünï \"q\" \u0007"}}, "required": ["zeta"]}, "description": "d"})"),
      std::string::npos)
      << p;
}

}  // namespace
}  // namespace dsa::text
