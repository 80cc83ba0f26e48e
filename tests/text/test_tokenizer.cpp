// The tokenizer against Hugging Face tokenizers' ids (goldens made by
// scripts/make_tokenizer_goldens.js), round trips, the stream decoder and the refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "dsa/error.h"
#include "dsa/text/tokenizer.h"
#include "text/utf8.h"

namespace dsa::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const fs::path kDeepSeekDir = DSA_DEEPSEEK_TOKENIZER_DIR;
const fs::path kTinyDir = fs::path(DSA_TOKENIZER_DATA) / "tiny";
const fs::path kData = DSA_TEXT_TEST_DATA;

const Tokenizer& deepseek() {
  static const Tokenizer t = Tokenizer::from_dir(kDeepSeekDir);
  return t;
}
const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::from_dir(kTinyDir);
  return t;
}
#define REQUIRE_DEEPSEEK()                                       \
  if (!fs::exists(kDeepSeekDir / "tokenizer.json"))              \
  GTEST_SKIP() << "no DeepSeek-V3 tokenizer at " << kDeepSeekDir \
               << " (set DSA_DEEPSEEK_TOKENIZER_DIR)"

bool valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Step step = utf8_step(s, pos);
    if (step.kind != Utf8Step::kValid) return false;
    pos += step.length;
  }
  return true;
}

// Every golden case: encode gives HF's ids, decode gives the text back.
void check_goldens(const Tokenizer& tok, const char* file) {
  const json goldens = json::parse(read(kData / file));
  int passed = 0, total = 0;
  for (const json& c : goldens["cases"]) {
    ++total;
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, expected) << c["name"] << ": " << json(text).dump();
    EXPECT_EQ(tok.decode(expected), text) << c["name"];
    passed += ids == expected;
  }
  EXPECT_GT(total, 400);
  EXPECT_EQ(passed, total) << file;
  std::cout << file << ": " << passed << "/" << total << " cases identical to HF tokenizers\n";
}

TEST(TokenizerGoldens, DeepSeekV3MatchesHuggingFace) {
  REQUIRE_DEEPSEEK();
  check_goldens(deepseek(), "goldens_deepseek_v3.json");
}

TEST(TokenizerGoldens, TinyMatchesHuggingFace) { check_goldens(tiny(), "goldens_tiny.json"); }

TEST(Tokenizer, DeepSeekTables) {
  REQUIRE_DEEPSEEK();
  const Tokenizer& t = deepseek();
  EXPECT_EQ(t.vocab_size(), 128815);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(t.token_to_id("Ġt"), 259);  // vocabulary entries in the file's spelling
  EXPECT_FALSE(t.token_to_id("no such token"));
  EXPECT_TRUE(t.is_special(0));
  EXPECT_FALSE(t.is_special(128803));  // <｜User｜> is an added token, not "special"
  EXPECT_FALSE(t.is_special(259));
  EXPECT_EQ(t.decode(std::vector<int32_t>{259}), " t");
}

TEST(Tokenizer, TinyTables) {
  const Tokenizer& t = tiny();
  EXPECT_EQ(t.vocab_size(), 1024);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  for (const char* tok : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
                          "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"}) {
    const auto id = t.token_to_id(tok);
    ASSERT_TRUE(id) << tok;
    EXPECT_EQ(t.encode(tok), std::vector<int32_t>{*id}) << tok;
    EXPECT_EQ(t.decode(std::vector<int32_t>{*id}), tok);
  }
}

TEST(Tokenizer, EncodeOrdinaryMatchesNoAddedToken) {
  const Tokenizer& t = tiny();
  const std::string text = "<｜User｜>hi<think>";
  const auto with = t.encode(text), without = t.encode_ordinary(text);
  EXPECT_EQ(with.front(), *t.token_to_id("<｜User｜>"));
  for (const int32_t id : without) EXPECT_LT(id, 1007) << "an added token in encode_ordinary";
  EXPECT_EQ(t.decode(without), text);
  EXPECT_EQ(t.encode_ordinary("plain words, 123"), t.encode("plain words, 123"));
}

// Random valid UTF-8 from a mix of scripts: decode(encode(s)) == s for both tokenizers.
std::string random_utf8(std::mt19937& rng, int n) {
  static const std::pair<char32_t, char32_t> ranges[] = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x2FF},      {0x300, 0x36F},
      {0x400, 0x4FF},   {0x600, 0x6FF},   {0x2000, 0x206F},   {0x3000, 0x30FF},
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F64F}, {0x10000, 0x10FFFF}};
  std::string s;
  for (int i = 0; i < n; ++i) {
    const auto& [lo, hi] = ranges[rng() % std::size(ranges)];
    char32_t cp = lo + rng() % (hi - lo + 1);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    append_utf8(s, cp);
  }
  return s;
}

TEST(Tokenizer, RoundTripRandomUtf8) {
  std::mt19937 rng(7);
  std::vector<const Tokenizer*> toks{&tiny()};
  if (fs::exists(kDeepSeekDir / "tokenizer.json")) toks.push_back(&deepseek());
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_utf8(rng, 1 + int(rng() % 200));
    for (const Tokenizer* t : toks) {
      ASSERT_EQ(t->decode(t->encode(s)), s);
      ASSERT_EQ(t->decode(t->encode_ordinary(s)), s);
    }
  }
}

TEST(Tokenizer, LongWordsMergeLikeShortOnes) {
  // A word longer than the short-merge limit (64 bytes) goes through the heap instead of the scan;
  // both must give the same tokens. "in" is DeepSeek's third merge and no merge joins "in" + "in",
  // so a run of n "in"s is n tokens of "in", whatever the path.
  const Tokenizer& t = tiny();
  const auto in = t.encode("in");
  ASSERT_EQ(in.size(), 1u);
  for (const int n : {2, 32, 33, 3000}) {  // 4 and 64 bytes: the scan; 66 and 6000: the heap
    std::string word;
    for (int i = 0; i < n; ++i) word += "in";
    EXPECT_EQ(t.encode(word), std::vector<int32_t>(n, in[0])) << n;
  }
}

TEST(Tokenizer, InvalidUtf8NamesTheOffset) {
  const std::string bad = std::string("abc\xC3") + "(";
  try {
    (void)tiny().encode(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)tiny().encode("\xED\xA0\x80"), Error);  // a surrogate
  EXPECT_THROW((void)tiny().encode("ok\xF0\x9F"), Error);    // cut off at the end
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  try {
    (void)tiny().decode(std::vector<int32_t>{5, 1024});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("1024 is outside the vocabulary [0, 1024)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)tiny().decode(std::vector<int32_t>{-1}), Error);
}

// ---- the stream decoder ----

std::vector<int32_t> byte_ids(const Tokenizer& t, std::string_view bytes) {
  // One single-byte token per byte: the finest split a stream can see.
  std::vector<int32_t> ids;
  for (const char c : bytes) {
    const std::string one(1, c);
    bool found = false;
    for (int32_t id = 0; id < t.vocab_size() && !found; ++id) {
      if (t.token_bytes(id) == one && !t.is_special(id)) {
        ids.push_back(id);
        found = true;
      }
    }
    EXPECT_TRUE(found);
  }
  return ids;
}

std::string stream(const Tokenizer& t, std::span<const int32_t> ids) {
  StreamDecoder d(t);
  std::string out;
  for (const int32_t id : ids) {
    const std::string piece = d.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << json(piece).dump();
    out += piece;
  }
  const std::string tail = d.finish();
  EXPECT_TRUE(valid_utf8(tail));
  return out + tail;
}

TEST(StreamDecoder, EveryByteSplitGivesTheText) {
  const std::string text = read(kData / "multilingual.txt");
  const Tokenizer& t = tiny();
  EXPECT_EQ(stream(t, byte_ids(t, text)), text);
  EXPECT_EQ(stream(t, t.encode(text)), text);
}

TEST(StreamDecoder, HoldsEachCharacterUntilItsLastByte) {
  // Byte by byte, a character appears whole with its last byte and nothing comes before it.
  const Tokenizer& t = tiny();
  for (const std::string ch : {"é", "中", "😀", "\u200d"}) {
    const auto ids = byte_ids(t, ch);
    StreamDecoder d(t);
    for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(d.push(ids[i]), "") << ch << " " << i;
    EXPECT_EQ(d.push(ids.back()), ch);
    EXPECT_EQ(d.finish(), "");
  }
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& t = tiny();
  // 0xFF never starts a character; E2 82 then 'A' is one maximal subpart; F0 9F at the end is an
  // incomplete character flushed by finish().
  const std::string bytes = std::string("a\xFF") + "b\xE2\x82" + "A\xF0\x9F";
  EXPECT_EQ(stream(t, byte_ids(t, bytes)), "a\uFFFDb\uFFFDA\uFFFD");
  StreamDecoder d(t);
  EXPECT_EQ(d.push(byte_ids(t, "\xE4")[0]), "");
  EXPECT_EQ(d.push(byte_ids(t, "\xB8")[0]), "");
  EXPECT_EQ(d.push(byte_ids(t, "\xAD")[0]), "中");
  EXPECT_EQ(d.finish(), "");
}

// ---- refusals ----

json tiny_json() { return json::parse(read(kTinyDir / "tokenizer.json")); }

std::string load_error(const json& j) {
  try {
    (void)Tokenizer::from_json(j.dump(), "", "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "loaded";
}

TEST(TokenizerLoad, RefusesWhatItDoesNotImplement) {
  json j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"].insert(j["pre_tokenizer"]["pretokenizers"].begin() + 1,
                                             json{{"type", "Metaspace"}});
  EXPECT_NE(load_error(j).find("unsupported pre_tokenizer type 'Metaspace' at "
                               "pre_tokenizer.pretokenizers[1]"),
            std::string::npos)
      << load_error(j);
  j = tiny_json();
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(load_error(j).find("unsupported normalizer type 'NFC'"), std::string::npos);
  j = tiny_json();
  j["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(j).find("unsupported model type 'Unigram'"), std::string::npos);
  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  EXPECT_NE(load_error(j).find("unsupported Split behavior 'MergedWithPrevious'"),
            std::string::npos);
  j = tiny_json();
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(load_error(j).find("model.byte_fallback = true"), std::string::npos);
  j = tiny_json();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(j).find("unsupported decoder type 'WordPiece'"), std::string::npos);
  j = tiny_json();
  j["added_tokens"][3]["lstrip"] = true;
  EXPECT_NE(load_error(j).find("added_tokens[3].lstrip = true"), std::string::npos);
  j = tiny_json();
  j["model"]["merges"][5] = "Ġ";
  EXPECT_NE(load_error(j).find("model.merges[5]"), std::string::npos);
  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(load_error(j).find("does not compile"), std::string::npos);
}

TEST(TokenizerLoad, MissingFileIsAnIoError) {
  try {
    (void)Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

TEST(TokenizerLoad, StringAndPairMergesAreTheSame) {
  json j = tiny_json();
  for (json& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const Tokenizer strings = Tokenizer::from_json(j.dump());
  const std::string text = read(kData / "multilingual.txt");
  EXPECT_EQ(strings.encode(text), tiny().encode(text));
}

TEST(TokenizerLoad, BuiltinTinyIsTheDataFile) {
  const auto files = builtin_tokenizer("tiny");
  ASSERT_TRUE(files);
  EXPECT_EQ(files->tokenizer_json, read(kTinyDir / "tokenizer.json"));
  EXPECT_EQ(files->tokenizer_config_json, read(kTinyDir / "tokenizer_config.json"));
  EXPECT_FALSE(builtin_tokenizer("nope"));
}

}  // namespace
}  // namespace dsa::text
