// The chat encoder against the renderings of DeepSeek's own Python encoders
// (tests/data/text/chat/*.json, made by scripts/make_chat_goldens.py), byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dsa/text/chat.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;

std::vector<std::filesystem::path> golden_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(DSA_TEXT_TEST_DATA "/chat")) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

Json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

// Where two renderings first differ, with some context, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  want: ..." +
         want.substr(from, 100) + "\n  got:  ..." + got.substr(from, 100);
}

TEST(ChatGolden, EveryRenderingMatchesTheOfficialEncoder) {
  const auto files = golden_files();
  ASSERT_GE(files.size(), 15u) << "expected at least 15 golden conversations";
  int renderings = 0, v32 = 0, v4 = 0, thinking = 0;
  for (const auto& path : files) {
    const Json golden = read_json(path);
    for (const Json& r : golden["renderings"]) {
      const ChatFormat format = parse_chat_format(r["format"].get<std::string>());
      ChatRequest req = parse_chat_request(golden["request"]);
      req.thinking = r["thinking"].get<bool>();
      const std::string want = r["prompt"].get<std::string>();
      const std::string got = render_chat(req, format);
      EXPECT_EQ(got, want) << path.filename() << " format " << chat_format_name(format)
                           << " thinking " << req.thinking << "\n"
                           << first_difference(want, got);
      ++renderings;
      (format == ChatFormat::kV32 ? v32 : v4)++;
      thinking += req.thinking;
    }
  }
  EXPECT_GE(renderings, 60);
  EXPECT_GT(v32, 20);
  EXPECT_GT(v4, 20);
  EXPECT_GT(thinking, 20);
  std::printf("%zu conversations, %d renderings (%d v32, %d v4, %d thinking)\n", files.size(),
              renderings, v32, v4, thinking);
}

TEST(ChatGolden, FormatsDifferByTheirEnvelope) {
  const Json request = Json::parse(R"({"messages": [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "a", "content": "ok"}]})");
  const ChatRequest req = parse_chat_request(request);
  const std::string v32 = render_chat(req, ChatFormat::kV32);
  const std::string v4 = render_chat(req, ChatFormat::kV4);
  EXPECT_NE(v32.find("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">"), std::string::npos);
  EXPECT_EQ(v32.find("tool_calls>"), std::string::npos);
  EXPECT_NE(v4.find("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">"), std::string::npos);
  EXPECT_NE(v32.find("<function_results>\n<result>ok</result>"), std::string::npos);
  EXPECT_NE(v4.find("<｜User｜><tool_result>ok</tool_result><｜Assistant｜></think>"),
            std::string::npos);
}

}  // namespace
}  // namespace dsa::text
