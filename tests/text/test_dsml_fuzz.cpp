// Generated DSML shapes, valid and broken in the ways models break them. Every shape must parse
// without a crash, give the same result under random chunking, produce arguments that are valid
// JSON objects, and land in the class the malformed-text rule predicts for its defect.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "dsml_test_util.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;

enum class Defect {
  kNone,
  kNoWrapper,
  kWrongBlockName,
  kUnterminated,
  kBadJsonValue,
  kDuplicateParameter,
  kBadCloseTag,
  kBadInvokeHeader,
  kEmptyEnvelope,
  kManyCalls,
  kEmptyArguments,
};
constexpr const char* kDefectNames[] = {"valid",         "missing wrapper",   "wrong block name",
                                        "unterminated",  "bad JSON value",    "duplicate param",
                                        "bad close tag", "bad invoke header", "empty envelope",
                                        "many calls",    "empty arguments"};

const std::vector<std::string> kStrings = {"Paris",
                                           "",
                                           "a \"quoted\" word",
                                           "back\\slash",
                                           "</div> and </",
                                           "line1\nline2\n",
                                           "東京 ☀️ 👩‍💻",
                                           "<｜DSML｜invoke name=\"x\">",
                                           "</｜DSML｜paragraph>",
                                           "tab\there",
                                           "\x01\x1f",
                                           "x < y > z",
                                           "</｜DSML｜invoke>",
                                           "ends with <"};
const std::vector<std::string> kJsonValues = {"3",
                                              "-0.5",
                                              "1e5",
                                              "true",
                                              "null",
                                              "[1, 2, 3]",
                                              "{\"a\": {\"b\": [\"</x>\"]}}",
                                              "\"s\"",
                                              "  7  ",
                                              "[]",
                                              "{}",
                                              "{\"k\": \"東京\"}"};
const std::vector<std::string> kBadJson = {
    "NaN", "Infinity", "{\"a\": 1, \"a\": 2}", "[1] x", "", "'s'", "[1,]", "{\"a\" 1}"};
const std::vector<std::string> kBadHeaders = {"name=\"f", "name=\"\"",     "nam=\"f\"",
                                              "name=f",   "name=\"a\nb\"", "name=\"f\" junk"};
const std::vector<std::string> kPrefixes = {
    "", "Let me check.", "a < b, c </ d", "東京の天気 🌧", "\n", "Quote: \"x\"\n"};

struct Param {
  std::string name, value;
  bool is_string;
};
struct Call {
  std::string name;
  std::vector<Param> params;
};

struct Shape {
  Defect defect = Defect::kNone;
  std::string text;
  std::string prefix;
  std::vector<Call> calls;
  int broken_call = -1;  // the call the defect hits
};

std::string render_param(const Param& p) {
  return "<｜DSML｜parameter name=\"" + p.name + "\" string=\"" + (p.is_string ? "true" : "false") +
         "\">" + p.value + "</｜DSML｜parameter>";
}
std::string render_call(const Call& c) {
  std::string s = "<｜DSML｜invoke name=\"" + c.name + "\">\n";
  for (const auto& p : c.params) s += render_param(p) + "\n";
  return s + "</｜DSML｜invoke>";
}

Shape generate(std::mt19937& rng, Defect defect) {
  auto pick = [&](const auto& v) -> const auto& { return v[rng() % v.size()]; };
  Shape s;
  s.defect = defect;
  s.prefix = pick(kPrefixes);
  int n_calls = 1 + int(rng() % 4);
  if (defect == Defect::kManyCalls) n_calls = 10 + int(rng() % 30);
  if (defect == Defect::kEmptyEnvelope) n_calls = 0;
  for (int i = 0; i < n_calls; ++i) {
    Call c;
    c.name = pick(std::vector<std::string>{"get_weather", "bash", "search", "写文件", "f"});
    const int n_params = defect == Defect::kEmptyArguments ? 0 : int(rng() % 4);
    for (int k = 0; k < n_params; ++k) {
      const bool str = rng() % 2;
      c.params.push_back({"p" + std::to_string(k), str ? pick(kStrings) : pick(kJsonValues), str});
    }
    s.calls.push_back(std::move(c));
  }
  const bool needs_param = defect == Defect::kBadJsonValue ||
                           defect == Defect::kDuplicateParameter || defect == Defect::kBadCloseTag;
  if (needs_param || defect == Defect::kBadInvokeHeader) {
    s.broken_call = int(rng() % s.calls.size());
    auto& params = s.calls[size_t(s.broken_call)].params;
    if (defect == Defect::kBadJsonValue) params.push_back({"bad", pick(kBadJson), false});
    if (defect == Defect::kDuplicateParameter) {
      params.push_back({"dup", "1", false});
      params.push_back({"dup", "two", true});
    }
    if (defect == Defect::kBadCloseTag) params.push_back({"cmd", "echo hi", true});
    if (defect == Defect::kBadInvokeHeader) {
      // The rejected invoke's text is content again, where an invoke tag inside one of its
      // values would begin a call of its own (the rule, but not this shape's point).
      for (auto& p : params) {
        if (p.value.find("<｜DSML｜invoke") != std::string::npos) p.value = "Paris";
      }
    }
  }
  const std::string wrap = rng() % 2 ? "function_calls" : "tool_calls";
  std::string open = "<｜DSML｜" + wrap + ">\n", close = "\n</｜DSML｜" + wrap + ">";
  if (defect == Defect::kNoWrapper) open = close = "";
  if (defect == Defect::kWrongBlockName) {
    const std::string bad = pick(std::vector<std::string>{"tool_call", "calls", "function_call"});
    open = "<｜DSML｜" + bad + ">\n";
    close = "\n</｜DSML｜" + bad + ">";
  }
  std::string body;
  for (size_t i = 0; i < s.calls.size(); ++i) {
    std::string call = render_call(s.calls[i]);
    if (int(i) == s.broken_call && defect == Defect::kBadInvokeHeader) {
      const size_t at = call.find("name=\"");
      call = call.substr(0, at) + pick(kBadHeaders) + call.substr(call.find(">\n") + 0);
    }
    if (int(i) == s.broken_call && defect == Defect::kBadCloseTag) {
      const std::string tag = "echo hi</｜DSML｜parameter>";
      call.replace(call.rfind(tag), tag.size(), "echo hi</｜DSML｜parameter\n");
    }
    body += (i ? "\n" : "") + call;
  }
  s.text = s.prefix + "\n\n" + open + body + close;
  if (defect == Defect::kUnterminated) {
    const size_t start = s.prefix.size() + 2;
    s.text.resize(start + 1 + rng() % (s.text.size() - start - 1));
  }
  return s;
}

// What the rule says a shape must come to; empty when it holds.
std::string check_rule(const Shape& s, const ParsedCompletion& r) {
  const int n = int(s.calls.size());
  int complete = 0;
  for (const auto& c : r.tool_calls) complete += c.complete;
  auto args_match = [&](int from, int to) -> std::string {
    for (int i = from; i < to; ++i) {
      const Json got = Json::parse(r.tool_calls[size_t(i)].arguments);
      Json want = Json::object();
      for (const auto& p : s.calls[size_t(i)].params) {
        want[p.name] = p.is_string ? Json(p.value) : Json::parse(p.value);
      }
      if (got != want) return "call " + std::to_string(i) + " arguments " + got.dump();
      if (r.tool_calls[size_t(i)].name != s.calls[size_t(i)].name) return "call name differs";
    }
    return "";
  };
  switch (s.defect) {
    case Defect::kNone:
    case Defect::kNoWrapper:
    case Defect::kManyCalls:
    case Defect::kEmptyArguments:
    case Defect::kWrongBlockName:
      if (complete != n || r.malformed_calls || r.rejected_blocks) return "expected all complete";
      if (s.defect != Defect::kWrongBlockName && r.content != s.prefix) return "content differs";
      if (s.defect == Defect::kWrongBlockName && r.content.find("<｜DSML｜") == std::string::npos) {
        return "the unknown block tags belong in content";
      }
      return args_match(0, n);
    case Defect::kBadJsonValue:
    case Defect::kDuplicateParameter:
    case Defect::kBadCloseTag: {
      if (int(r.tool_calls.size()) != n || r.malformed_calls != 1 || complete != n - 1) {
        return "expected exactly the broken call to be malformed";
      }
      if (r.tool_calls[size_t(s.broken_call)].complete) return "the broken call completed";
      const std::string evidence = s.defect == Defect::kBadCloseTag ? "</｜DSML｜parameter\n"
                                   : s.defect == Defect::kBadJsonValue
                                       ? "name=\"bad\" string=\"false\">"
                                       : "name=\"dup\" string=\"true\">two";
      if (r.content.find(evidence) == std::string::npos)
        return "the fault's text is not in content";
      return args_match(0, s.broken_call);
    }
    case Defect::kBadInvokeHeader:
      if (int(r.tool_calls.size()) != n - 1 || complete != n - 1 || r.rejected_blocks < 1) {
        return "expected the broken invoke rejected, the others complete";
      }
      return args_match(0, s.broken_call);
    case Defect::kEmptyEnvelope:
      if (!r.tool_calls.empty() || r.rejected_blocks != 1 || r.content != s.text) {
        return "expected the empty envelope back in content";
      }
      return "";
    case Defect::kUnterminated:
      if (r.malformed_calls > 1 || complete + r.malformed_calls != int(r.tool_calls.size())) {
        return "a cut text ends at most one call";
      }
      return args_match(0, complete);
  }
  return "unknown defect";
}

TEST(DsmlFuzz, GeneratedShapesFollowTheRule) {
  std::mt19937 rng(2024);
  constexpr int kPerDefect = 60;
  struct Tally {
    int shapes = 0, complete = 0, malformed = 0, rejected = 0, passed = 0;
  };
  std::map<int, Tally> table;
  int total = 0;
  for (int d = 0; d <= int(Defect::kEmptyArguments); ++d) {
    for (int i = 0; i < kPerDefect; ++i) {
      const Shape s = generate(rng, Defect(d));
      SCOPED_TRACE(std::string(kDefectNames[d]) + " #" + std::to_string(i) + ": " + s.text);
      const ParsedCompletion whole = parse_completion(s.text);
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<size_t> cuts;
        for (size_t p = 0; p < s.text.size();) {
          p += 1 + rng() % 12;
          if (p < s.text.size()) cuts.push_back(p);
        }
        ParsedCompletion got;
        const bool utf8 = testing::valid_utf8(s.text);
        ASSERT_TRUE(
            testing::same_as_whole(testing::stream(s.text, cuts, false, &got, utf8), got, whole));
      }
      for (const auto& c : whole.tool_calls) {
        const Json args = Json::parse(c.arguments, nullptr, false);
        ASSERT_TRUE(args.is_object()) << c.arguments;
        ASSERT_EQ(c.arguments.find("</｜DSML｜parameter"), std::string::npos);
      }
      const std::string verdict = check_rule(s, whole);
      EXPECT_EQ(verdict, "");
      Tally& t = table[d];
      ++t.shapes;
      for (const auto& c : whole.tool_calls) t.complete += c.complete;
      t.malformed += whole.malformed_calls;
      t.rejected += whole.rejected_blocks;
      t.passed += verdict.empty();
      ++total;
    }
  }
  EXPECT_GE(total, 500);
  std::printf("%-18s %6s %9s %9s %9s %7s\n", "shape", "shapes", "complete", "malformed", "rejected",
              "by rule");
  for (const auto& [d, t] : table) {
    std::printf("%-18s %6d %9d %9d %9d %7d\n", kDefectNames[d], t.shapes, t.complete, t.malformed,
                t.rejected, t.passed);
  }
}

}  // namespace
}  // namespace dsa::text
