// A bounded randomized fuzz of the two parsers that read untrusted files: the safetensors header
// and config.json. Valid seeds are mutated (bytes flipped, JSON tokens and extreme numbers
// spliced in, ranges cut and repeated) for a fixed number of iterations with a fixed seed. Every
// input must either parse into something that passes its own invariants, or be refused with a
// dsa::Error of the input's code; any other exception, crash or hang fails the test.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dsa/config.h"
#include "dsa/error.h"
#include "model/json_read.h"
#include "model/safetensors.h"

namespace dsa {
namespace {

constexpr int kIterations = 3000;  // per parser; a few hundred milliseconds in all

const char* const kTokens[] = {"[",
                               "]",
                               "{",
                               "}",
                               "\"",
                               ",",
                               ":",
                               "-",
                               "0",
                               "-1",
                               "1e308",
                               "256.75",
                               "true",
                               "null",
                               "\"\"",
                               "[[[[",
                               "4294967552",
                               "-4294967040",
                               "18446744073709551616",
                               "9223372036854775807",
                               "\"yarn\"",
                               "\"F8_E4M3\"",
                               "\\u0000",
                               "\"data_offsets\"",
                               "\"rope_scaling\""};

std::string mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : size_t(rng() % n); };
  const int edits = 1 + int(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = char(rng() & 0xFF);
        break;
      case 1:  // splice in a token
        s.insert(pick(s.size() + 1), kTokens[pick(std::size(kTokens))]);
        break;
      case 2: {  // cut a range
        const size_t at = pick(s.size() + 1);
        s.erase(at, pick(16) + 1);
        break;
      }
      case 3: {  // repeat a range
        const size_t at = pick(s.size() + 1), n = std::min(pick(32) + 1, s.size() - at);
        s.insert(at, s.substr(at, n));
        break;
      }
      default: {  // replace a number with an extreme one
        const size_t at = s.find_first_of("0123456789", pick(s.size() + 1));
        if (at == std::string::npos) break;
        const size_t end = s.find_first_not_of("0123456789.e-", at);
        s.replace(at, (end == std::string::npos ? s.size() : end) - at,
                  kTokens[8 + pick(std::size(kTokens) - 8)]);
      }
    }
  }
  return s;
}

TEST(ParserFuzz, SafetensorsHeaderRefusesOrValidates) {
  const std::string seed =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F8_E4M3","shape":[4,8],)"
      R"("data_offsets":[0,32]},"w_scale_inv":{"dtype":"F32","shape":[1,1],)"
      R"("data_offsets":[32,36]},"b":{"dtype":"BF16","shape":[8],"data_offsets":[36,52]},)"
      R"("e":{"dtype":"BF16","shape":[0,3],"data_offsets":[52,52]}})";
  ASSERT_EQ(parse_safetensors_header(seed, 52, "seed").tensors.size(), 4u);
  std::mt19937_64 rng(20261202);
  int accepted = 0, refused = 0;
  for (int i = 0; i < kIterations; ++i) {
    const std::string input = mutate(seed, rng);
    const uint64_t buffer = rng() % 80;
    try {
      const StHeader h = parse_safetensors_header(input, buffer, "fuzz");
      for (const auto& [name, t] : h.tensors) {
        ASSERT_LE(t.begin, t.end) << input;
        ASSERT_LE(t.end, buffer) << input;
        ASSERT_EQ(uint64_t(t.numel()) * uint64_t(st_dtype_size(t.dtype)), t.end - t.begin) << input;
      }
      ++accepted;
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kIo) << e.what() << "\ninput: " << input;
      ASSERT_NE(std::string(e.what()).find("fuzz"), std::string::npos) << e.what();
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "escaped as " << e.what() << "\ninput: " << input;
    }
  }
  EXPECT_GT(accepted, 0);  // the mutations are not all fatal: both paths are exercised
  EXPECT_GT(refused, kIterations / 2);
}

TEST(ParserFuzz, ConfigRefusesOrValidates) {
  for (const char* preset : {"tiny-moe", "v32"}) {
    const std::string seed = config_to_json(preset_config(preset)).dump();
    std::mt19937_64 rng(7);
    int accepted = 0;
    for (int i = 0; i < kIterations / 2; ++i) {
      const std::string input = mutate(seed, rng);
      try {
        const ModelConfig c =
            config_from_json(parse_json_bounded(input, 16, "fuzz", ErrorCode::kIo));
        EXPECT_NO_THROW(c.validate()) << input;
        // What loaded is exactly what it writes back: nothing was silently dropped or wrapped.
        ASSERT_EQ(config_to_json(config_from_json(config_to_json(c))), config_to_json(c)) << input;
        ++accepted;
      } catch (const Error& e) {
        ASSERT_TRUE(e.code() == ErrorCode::kIo || e.code() == ErrorCode::kInvalidArgument)
            << e.what() << "\ninput: " << input;
      } catch (const std::exception& e) {
        FAIL() << "escaped as " << e.what() << "\ninput: " << input;
      }
    }
    EXPECT_GT(accepted, 0) << preset;
  }
}

}  // namespace
}  // namespace dsa
