// The DSML parser: a table of cases with their exact results, each fed whole, cut at every
// byte, and cut at random many times; the folded deltas must equal the whole parse every time.
#include <gtest/gtest.h>

#include <random>

#include "dsa/text/chat.h"
#include "dsml_test_util.h"

namespace dsa::text {
namespace {

using testing::same_as_whole;
using testing::stream;

struct Call {
  std::string name, arguments;
  bool complete = true;
};

struct Case {
  std::string name;
  bool thinking;
  std::string text;
  std::string content;
  std::string reasoning;
  std::vector<Call> calls;
  int malformed = 0;
  int rejected = 0;
};

const std::string kFc = "<｜DSML｜function_calls>";
const std::string kFcEnd = "</｜DSML｜function_calls>";
const std::string kTc = "<｜DSML｜tool_calls>";
const std::string kTcEnd = "</｜DSML｜tool_calls>";
std::string invoke(const std::string& name, const std::string& params) {
  return "<｜DSML｜invoke name=\"" + name + "\">\n" + params + "</｜DSML｜invoke>\n";
}
std::string param(const std::string& name, bool str, const std::string& value) {
  return "<｜DSML｜parameter name=\"" + name + "\" string=\"" + (str ? "true" : "false") + "\">" +
         value + "</｜DSML｜parameter>\n";
}

std::vector<Case> cases() {
  const std::string weather =
      invoke("get_weather", param("city", true, "Paris") + param("days", false, "3"));
  return {
      {"plain",
       false,
       "Hello, world! <b>bold</b> a<b and \n\n x",
       "Hello, world! <b>bold</b> a<b and \n\n x",
       "",
       {}},
      {"reasoning",
       true,
       "Let me think.</think>The answer is 4.",
       "The answer is 4.",
       "Let me think.",
       {}},
      {"reasoning_unterminated", true, "still thinking </thin", "", "still thinking </thin", {}},
      {"one_call_v32",
       false,
       "Checking.\n\n" + kFc + "\n" + weather + kFcEnd,
       "Checking.",
       "",
       {{"get_weather", R"({"city": "Paris", "days": 3})"}}},
      {"one_call_v4_thinking",
       true,
       "Need weather.</think>\n\n" + kTc + "\n" + weather + kTcEnd,
       "",
       "Need weather.",
       {{"get_weather", R"({"city": "Paris", "days": 3})"}}},
      {"parallel_calls",
       false,
       "\n\n" + kTc + "\n" + weather + invoke("bash", param("command", true, "ls -la")) +
           invoke("noop", "") + kTcEnd,
       "",
       "",
       {{"get_weather", R"({"city": "Paris", "days": 3})"},
        {"bash", R"({"command": "ls -la"})"},
        {"noop", "{}"}}},
      {"value_markup_and_quotes",
       false,
       kFc + "\n" +
           invoke("write",
                  param("text", true,
                        "<div class=\"x\">a\\b</div>\n</ \t<｜DSML｜invoke name=\"q\">"
                        "\x01 é 東京 👩‍💻") +
                      param("obj", false, "{\"a\": [1, {\"b\": null}], \"c\": \"</x>\"}")) +
           kFcEnd,
       "",
       "",
       {{"write",
         R"({"text": "<div class=\"x\">a\\b</div>\n</ \t<｜DSML｜invoke name=\"q\">\u0001 é 東京 👩‍💻", "obj": {"a": [1, {"b": null}], "c": "</x>"}})"}}},
      {"content_after_block",
       false,
       "A\n\n" + kFc + "\n" + invoke("f", "") + kFcEnd + " tail",
       "A tail",
       "",
       {{"f", "{}"}}},
      {"bare_invoke",
       false,
       "Sure.\n\n" + invoke("f", param("x", false, "1")) + "\n" + invoke("g", ""),
       "Sure.\n",
       "",
       {{"f", R"({"x": 1})"}, {"g", "{}"}}},
      {"wrong_block_name",
       false,
       "<｜DSML｜tool_call>\n" + invoke("f", "") + "</｜DSML｜tool_call>",
       "<｜DSML｜tool_call>\n</｜DSML｜tool_call>",
       "",
       {{"f", "{}"}}},
      {"json_nan",
       false,
       kFc + "\n" + invoke("f", param("a", true, "ok") + param("n", false, "NaN")) + kFcEnd,
       "\n<｜DSML｜parameter name=\"n\" "
       "string=\"false\">NaN</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
           kFcEnd,
       "",
       {{"f", R"({"a": "ok"})", false}},
       1,
       0},
      {"json_duplicate_key",
       false,
       kFc + invoke("f", param("o", false, "{\"k\": 1, \"k\": 2}")) + kFcEnd,
       "\n<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": 1, \"k\": "
       "2}</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
           kFcEnd,
       "",
       {{"f", "{}", false}},
       1,
       0},
      {"json_trailing_garbage",
       false,
       kFc + invoke("f", param("o", false, "[1] x")) + kFcEnd,
       "\n<｜DSML｜parameter name=\"o\" string=\"false\">[1] "
       "x</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
           kFcEnd,
       "",
       {{"f", "{}", false}},
       1,
       0},
      {"duplicate_parameter",
       false,
       kFc + invoke("f", param("a", true, "1") + param("a", true, "2")) + kFcEnd,
       "\n<｜DSML｜parameter name=\"a\" "
       "string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
           kFcEnd,
       "",
       {{"f", R"({"a": "1"})", false}},
       1,
       0},
      {"close_stem_without_angle",
       false,
       kFc + "<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"c\" string=\"true\">rm -rf "
             "/tmp/x</｜DSML｜parameter\n",
       "</｜DSML｜parameter\n",
       "",
       {{"bash", R"({"c": "rm -rf /tmp/x"})", false}},
       1,
       0},
      {"unterminated_in_value",
       false,
       "x" + kFc +
           "<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"c\" string=\"true\">echo "
           "hi</｜DSML｜para",
       "x</｜DSML｜para",
       "",
       {{"bash", R"({"c": "echo hi"})", false}},
       1,
       0},
      {"unterminated_in_header",
       false,
       "x\n\n" + kFc + "\n<｜DSML｜invoke name=\"ba",
       "x\n\n" + kFc + "\n<｜DSML｜invoke name=\"ba",
       "",
       {},
       0,
       1},
      {"unterminated_after_calls", false, kFc + "\n" + invoke("f", ""), "\n", "", {{"f", "{}"}}},
      {"empty_envelope",
       false,
       "a\n\n" + kFc + "\n" + kFcEnd + "b",
       "a\n\n" + kFc + "\n" + kFcEnd + "b",
       "",
       {},
       0,
       1},
      {"invoke_without_name",
       false,
       kTc + "\n<｜DSML｜invoke>\n" + kTcEnd,
       kTc + "\n<｜DSML｜invoke>\n" + kTcEnd,
       "",
       {},
       0,
       1},
      {"missing_string_attribute",
       false,
       kTc + invoke("f", "<｜DSML｜parameter name=\"a\">1</｜DSML｜parameter>\n") + kTcEnd,
       "\n<｜DSML｜parameter name=\"a\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n" + kTcEnd,
       "",
       {{"f", "{}", false}},
       1,
       0},
      {"second_envelope_inside_first",
       false,
       kFc + "\n" + kFc + "\n" + invoke("f", "") + kFcEnd,
       kFc + "\n",
       "",
       {{"f", "{}"}},
       0,
       1},
  };
}

ParsedCompletion whole(const Case& c) {
  return parse_completion(c.text, ToolCallParserOptions{c.thinking, {}});
}

TEST(DsmlParser, CasesParseToTheirStatedResult) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ParsedCompletion r = whole(c);
    EXPECT_EQ(r.content, c.content);
    EXPECT_EQ(r.reasoning_content, c.reasoning);
    EXPECT_EQ(r.malformed_calls, c.malformed);
    EXPECT_EQ(r.rejected_blocks, c.rejected);
    ASSERT_EQ(r.tool_calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.tool_calls[i].name, c.calls[i].name);
      EXPECT_EQ(r.tool_calls[i].arguments, c.calls[i].arguments);
      EXPECT_EQ(r.tool_calls[i].complete, c.calls[i].complete);
      EXPECT_EQ(r.tool_calls[i].id, "call_" + std::to_string(i));
      EXPECT_TRUE(nlohmann::json::accept(r.tool_calls[i].arguments)) << r.tool_calls[i].arguments;
    }
    EXPECT_EQ(r.finish_reason(), c.calls.empty() ? "stop" : "tool_calls");
  }
}

TEST(DsmlParser, EverySplitPointGivesTheWholeResult) {
  int splits = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ParsedCompletion ref = whole(c);
    for (size_t cut = 0; cut <= c.text.size(); ++cut) {
      ParsedCompletion got;
      const auto f = stream(c.text, {cut}, c.thinking, &got, /*check_utf8=*/false);
      ASSERT_TRUE(same_as_whole(f, got, ref)) << "cut at " << cut;
      ++splits;
    }
    // One byte at a time: every delta is still whole UTF-8 characters.
    std::vector<size_t> bytes;
    for (size_t i = 1; i < c.text.size(); ++i) bytes.push_back(i);
    ParsedCompletion got;
    ASSERT_TRUE(same_as_whole(stream(c.text, bytes, c.thinking, &got), got, ref));
  }
  EXPECT_GT(splits, 3000);
  std::printf("%d single-cut streams checked\n", splits);
}

TEST(DsmlParser, RandomMultiSplitsGiveTheWholeResult) {
  std::mt19937 rng(7);
  int streams = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ParsedCompletion ref = whole(c);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      for (size_t p = 0; p < c.text.size();) {
        p += 1 + rng() % 9;
        if (p < c.text.size()) cuts.push_back(p);
      }
      ParsedCompletion got;
      ASSERT_TRUE(same_as_whole(stream(c.text, cuts, c.thinking, &got, false), got, ref))
          << "trial " << trial;
      ++streams;
    }
  }
  std::printf("%d random multi-cut streams checked\n", streams);
}

TEST(DsmlParser, StreamsANameBeforeArgumentsAndArgumentsAsTheyArrive) {
  ToolCallParser p(ToolCallParserOptions{false, [](int i) { return "req7-" + std::to_string(i); }});
  EXPECT_TRUE(p.feed("Running it.\n").empty() == false);
  auto d = p.feed("\n" + kFc + "\n<｜DSML｜invoke name=\"bash\">\n");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, ChatDelta::Kind::kToolCallStart);
  EXPECT_EQ(d[0].id, "req7-0");
  EXPECT_EQ(
      d[0].openai().dump(),
      R"({"tool_calls":[{"index":0,"id":"req7-0","type":"function","function":{"name":"bash","arguments":""}}]})");
  d = p.feed(
      "<｜DSML｜parameter name=\"command\" string=\"true\">echo one\necho two</｜DSML｜param");
  ASSERT_EQ(d.size(), 1u);  // the value streams before its closing tag is complete
  EXPECT_EQ(d[0].text, R"({"command": "echo one\necho two)");
  EXPECT_EQ(
      d[0].openai().dump(),
      R"({"tool_calls":[{"index":0,"function":{"arguments":"{\"command\": \"echo one\\necho two"}}]})");
  d = p.feed("eter>\n</｜DSML｜invoke>\n" + kFcEnd);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "\"}");
  p.finish();
  EXPECT_EQ(p.result().content, "Running it.");
  EXPECT_EQ(p.result().tool_calls.at(0).arguments, R"({"command": "echo one\necho two"})");
}

TEST(DsmlParser, LongArgumentsFedByteByByteStayLinear) {
  // A 1 MiB value fed one byte at a time: quadratic rescanning would not finish in the test's
  // time limit; the held tail never exceeds one tag.
  std::string value;
  for (int i = 0; value.size() < (1u << 20); ++i) value += "line " + std::to_string(i) + " </p>\n";
  const std::string text = kFc + invoke("write", param("text", true, value)) + kFcEnd;
  ToolCallParser p;
  size_t emitted = 0;
  for (char ch : text) {
    for (const auto& d : p.feed(std::string_view(&ch, 1))) emitted += d.text.size();
  }
  for (const auto& d : p.finish()) emitted += d.text.size();
  ASSERT_EQ(p.result().tool_calls.size(), 1u);
  EXPECT_TRUE(p.result().tool_calls[0].complete);
  EXPECT_EQ(emitted, p.result().tool_calls[0].arguments.size());
  EXPECT_EQ(nlohmann::json::parse(p.result().tool_calls[0].arguments)["text"], value);
}

TEST(DsmlParser, StrictJsonValues) {
  for (const char* ok : {"1", " -0.5e3 ", "\"s\"", "[1, [2, {}]]", "{\"a\": {\"a\": 1}}", "null",
                         "true", "{\"a\": 1, \"b\": {\"a\": 2}}"}) {
    EXPECT_TRUE(is_strict_json_value(ok)) << ok;
  }
  for (const char* bad : {"", " ", "NaN", "Infinity", "-Infinity", "[1,]", "{\"a\": 1, \"a\": 2}",
                          "[{\"x\": 1, \"x\": 1}]", "1 2", "{} x", "'s'", "01", "tru", "1e999"}) {
    EXPECT_FALSE(is_strict_json_value(bad)) << bad;
  }
}

TEST(DsmlParser, ParsersShareNoState) {
  const std::string a = kFc + invoke("f", param("x", true, "A")) + kFcEnd;
  const std::string b = "Just text </think> here";
  ToolCallParser pa, pb(ToolCallParserOptions{true, {}});
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {  // interleaved, byte by byte
    if (i < a.size()) pa.feed(a.substr(i, 1));
    if (i < b.size()) pb.feed(b.substr(i, 1));
  }
  pa.finish();
  pb.finish();
  EXPECT_EQ(pa.result().tool_calls.at(0).arguments, R"({"x": "A"})");
  EXPECT_EQ(pb.result().reasoning_content, "Just text ");
  EXPECT_EQ(pb.result().content, " here");
  EXPECT_TRUE(pb.result().tool_calls.empty());
}

}  // namespace
}  // namespace dsa::text
