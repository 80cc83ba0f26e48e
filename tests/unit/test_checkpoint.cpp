// Checkpoint directories: round trips (1 and 3 shards, bf16 and fp8, dense and MoE presets) give
// the same weights and bit-identical logits; every corruption gets a dsa::Error naming the file,
// the tensor and the numbers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/expect_error.h"
#include "common/prefill_logits.h"
#include "common/test_util.h"
#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "dsa/runner.h"
#include "model/safetensors.h"

namespace dsa {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kSeed = 7;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    dir_ = fs::temp_directory_path() / fmt::format("dsa_ckpt_{}_{}", ::getpid(), name);
    fs::remove_all(dir_);
    backend_ = make_cpu_backend();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& preset, int shards, bool fp8 = false) {
    const ModelConfig config = preset_config(preset);
    const Weights w = Weights::synthetic(*backend_, config, kSeed);
    CheckpointWriteOptions options;
    options.shards = shards;
    options.fp8 = fp8;
    options.existing = ExistingCheckpoint::kReplace;  // the tests rewrite one directory
    write_checkpoint(*backend_, config, w, dir_.string(), options);
    return dir_.string();
  }
  std::vector<Bf16> host(const Weights& w, const std::string& name) {
    const WeightTensor& t = w.tensors().at(name);
    std::vector<Bf16> v(size_t(t.numel()));
    backend_->copy_to_host(v.data(), t.data.data(), v.size() * sizeof(Bf16));
    return v;
  }
  // The logits of one eager prefill step of a short prompt.
  std::vector<float> step_logits(const ModelConfig& config, Weights w) {
    return prefill_logits(*backend_, config, std::move(w), byte_tokens("checkpoint rows"));
  }
  std::vector<int32_t> greedy(const ModelConfig& config, Weights w) {
    Model model(*backend_, config, std::move(w), 16, 128);
    CacheConfig cc;
    cc.num_layers = config.num_hidden_layers;
    cc.num_pages = 4;
    KvCache cache(*backend_, cc);
    Runner runner(model, cache, {});
    return generate_greedy(runner, cache, model, byte_tokens("weights"), 6);
  }
  // Rewrites one safetensors file through `edit` of its tensor list.
  void rewrite(const fs::path& path, const std::function<void(std::vector<StTensorView>&)>& edit) {
    std::vector<std::vector<uint8_t>> keep;
    std::vector<StTensorView> views;
    std::map<std::string, std::string> metadata;
    {
      SafetensorsFile f(path.string());
      metadata = f.metadata();
      for (const auto& [name, t] : f.tensors()) {
        const auto b = f.bytes(t);
        keep.emplace_back(b.begin(), b.end());
      }
      size_t i = 0;
      for (const auto& [name, t] : f.tensors())
        views.push_back({name, t.dtype, t.shape, keep[i++]});
    }
    edit(views);
    write_safetensors(path.string(), views, metadata);
  }

  fs::path dir_;
  std::unique_ptr<Backend> backend_;
};

using ::dsa::testing::expect_error;

// ---- round trips ----

class RoundTrip : public CheckpointTest,
                  public ::testing::WithParamInterface<std::tuple<std::string, int>> {};

TEST_P(RoundTrip, WeightsAndLogitsAreBitIdentical) {
  const auto [preset, shards] = GetParam();
  const std::string dir = write(preset, shards);
  EXPECT_EQ(fs::exists(dir_ / "model.safetensors.index.json"), shards > 1);
  ModelConfig loaded_config;
  Weights loaded = load_checkpoint(*backend_, dir, &loaded_config, {.strict = true});
  const ModelConfig config = preset_config(preset);
  EXPECT_EQ(nlohmann::json(config_to_json(loaded_config)), config_to_json(config));
  const Weights original = Weights::synthetic(*backend_, config, kSeed);
  ASSERT_EQ(loaded.tensors().size(), original.tensors().size());
  for (const auto& [name, t] : original.tensors()) {
    ASSERT_TRUE(loaded.contains(name)) << name;
    EXPECT_EQ(loaded.tensors().at(name).shape, t.shape) << name;
    const auto a = host(original, name), b = host(loaded, name);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Bf16)), 0) << name;
  }
  const std::vector<float> want = step_logits(config, Weights::synthetic(*backend_, config, kSeed));
  const std::vector<float> got = step_logits(loaded_config, std::move(loaded));
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(greedy(config, Weights::synthetic(*backend_, config, kSeed)),
            greedy(loaded_config, load_checkpoint(*backend_, dir)));
}

INSTANTIATE_TEST_SUITE_P(Presets, RoundTrip,
                         ::testing::Combine(::testing::Values("tiny", "tiny-moe"),
                                            ::testing::Values(1, 3)));

TEST_F(CheckpointTest, Fp8RoundTripDequantizesWithinFp8Precision) {
  const std::string dir = write("tiny-moe", 2, /*fp8=*/true);
  {
    // The stored layout is DeepSeek's: F8_E4M3 matrices with F32 [ceil(out/128), ceil(in/128)].
    SafetensorsFile f0((dir_ / "model-00001-of-00002.safetensors").string());
    SafetensorsFile f1((dir_ / "model-00002-of-00002.safetensors").string());
    const std::string name = "model.layers.0.self_attn.q_b_proj.weight";  // [4*192, 128]
    const StTensorInfo* w = f0.find(name) ? f0.find(name) : f1.find(name);
    const StTensorInfo* s =
        f0.find(name + "_scale_inv") ? f0.find(name + "_scale_inv") : f1.find(name + "_scale_inv");
    ASSERT_TRUE(w && s);
    EXPECT_EQ(w->dtype, StDtype::kF8E4M3);
    EXPECT_EQ(s->dtype, StDtype::kF32);
    EXPECT_EQ(s->shape, (std::vector<int64_t>{6, 1}));
    const StTensorInfo* e = f0.find("model.embed_tokens.weight")
                                ? f0.find("model.embed_tokens.weight")
                                : f1.find("model.embed_tokens.weight");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->dtype, StDtype::kBf16);
  }
  ModelConfig config;
  Weights loaded = load_checkpoint(*backend_, dir, &config, {.strict = true});
  const Weights original = Weights::synthetic(*backend_, config, kSeed);
  int fp8_tensors = 0;
  for (const WeightSpec& spec : weight_manifest(config)) {
    const auto a = host(original, spec.name), b = host(loaded, spec.name);
    if (!checkpoint_stores_fp8(spec.name, spec.shape)) {
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Bf16)), 0) << spec.name;
      continue;
    }
    ++fp8_tensors;
    const int64_t cols = spec.shape[1];
    // Block amax bounds the scale; e4m3 keeps 3 mantissa bits (relative 2^-4 at worst), its
    // subnormal step is scale * 2^-9, and bf16 adds 2^-9 relative.
    std::vector<float> amax(size_t(((spec.shape[0] + 127) / 128) * ((cols + 127) / 128)), 0.0f);
    const int64_t bc = (cols + 127) / 128;
    for (size_t i = 0; i < a.size(); ++i) {
      float& m = amax[(int64_t(i) / cols / 128) * bc + (int64_t(i) % cols) / 128];
      m = std::max(m, std::fabs(bf16_to_float(a[i])));
    }
    size_t changed = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
      const float scale = amax[(int64_t(i) / cols / 128) * bc + (int64_t(i) % cols) / 128] / 448;
      const float bound = std::fabs(x) * (0.0625f + 0.002f) + scale * 0x1p-9f;
      ASSERT_LE(std::fabs(x - y), bound) << spec.name << " element " << i;
      changed += a[i].bits != b[i].bits;
    }
    EXPECT_GT(changed, 0u) << spec.name << ": fp8 should lose some bits";
  }
  EXPECT_GT(fp8_tensors, 20);
  const std::vector<float> logits = step_logits(config, std::move(loaded));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(CheckpointTest, Fp8DequantizationIsExactProductOfBlockScale) {
  // A hand-built fp8 tensor: value = e4m3 * scale_inv of its block, then bf16.
  const std::string dir = write("tiny", 1, /*fp8=*/true);
  const fs::path file = dir_ / "model.safetensors";
  const std::string name = "model.layers.1.mlp.down_proj.weight";  // [256, 512]: 2 x 4 blocks
  std::vector<uint8_t> q(256 * 512);
  testing::Rng rng(3);
  for (auto& b : q) b = uint8_t(rng.integer(0, 255)) & 0xF7;  // no NaN code (0x7F / 0xFF)
  const std::vector<float> scales = {0.5f, 0.003f, 1.75f, 1e-3f, 2.0f, 0.25f, 0.01f, 3.0f};
  std::vector<uint8_t> scale_bytes(scales.size() * 4);
  std::memcpy(scale_bytes.data(), scales.data(), scale_bytes.size());
  rewrite(file, [&](std::vector<StTensorView>& v) {
    for (auto& t : v) {
      if (t.name == name) t.bytes = q;
      if (t.name == name + "_scale_inv") t.bytes = scale_bytes;
    }
  });
  Weights w = load_checkpoint(*backend_, dir);
  const auto got = host(w, name);
  for (int64_t r = 0; r < 256; r += 37) {
    for (int64_t c = 0; c < 512; c += 11) {
      const float want = fp8_to_float(Fp8E4M3{q[r * 512 + c]}) * scales[(r / 128) * 4 + c / 128];
      ASSERT_EQ(got[r * 512 + c].bits, float_to_bf16(want).bits) << r << "," << c;
    }
  }
}

// ---- corruption: each a clear error ----

// Writes a raw safetensors file: the length prefix (or `length` when given), the header, data.
void write_raw(const fs::path& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> length = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(char(uint8_t(n >> (8 * i))));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(char(i * 7 + 1));
}

TEST_F(CheckpointTest, SafetensorsHeaderErrorsNameFileTensorAndNumbers) {
  fs::create_directories(dir_);
  const fs::path f = dir_ / "x.safetensors";
  const auto open = [&] { SafetensorsFile file(f.string()); };
  const std::string ok = R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}})";

  write_raw(f, ok, 12);
  EXPECT_NO_THROW(open());
  write_raw(f, ok, 12, uint64_t(1) << 40);  // a corrupted length prefix
  expect_error(open, ErrorCode::kIo, {"x.safetensors", "header length 1099511627776"});
  write_raw(f, ok, 12, ok.size() + 100);  // runs past the end
  expect_error(open, ErrorCode::kIo,
               {"x.safetensors", "truncated", std::to_string(ok.size() + 100)});
  write_raw(f, R"({"a":{"dtype":"BF16",)", 12);
  expect_error(open, ErrorCode::kIo, {"x.safetensors", "not valid JSON"});
  write_raw(f, ok, 10);  // the buffer is 2 bytes short
  expect_error(open, ErrorCode::kIo, {"tensor a", "[0, 12]", "out of range", "holds 10 bytes"});
  write_raw(f, R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", 12);
  expect_error(open, ErrorCode::kIo, {"tensor a", "spans 10 bytes", "[2, 3]", "needs 12"});
  write_raw(f, R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_error(open, ErrorCode::kIo, {"tensor a", "unknown dtype 'Q4'"});
  write_raw(f,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12);
  expect_error(open, ErrorCode::kIo, {"tensors a [0, 8] and b [4, 12] overlap"});
  write_raw(f, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  expect_error(open, ErrorCode::kIo, {"tensor a", "not a non-negative integer"});
  std::ofstream(f, std::ios::binary | std::ios::trunc) << "abc";
  expect_error(open, ErrorCode::kIo, {"x.safetensors", "3 bytes"});
  fs::remove(f);
  expect_error(open, ErrorCode::kIo, {"x.safetensors", "cannot be opened"});
}

TEST_F(CheckpointTest, TruncatedShardIsAnError) {
  const std::string dir = write("tiny", 1);
  const fs::path file = dir_ / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 1000);
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {"model.safetensors", "out of range", "truncated"});
  fs::resize_file(file, 100);
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {"model.safetensors", "truncated", "only 92 bytes follow"});
}

TEST_F(CheckpointTest, MissingMisshapenAndMistypedTensorsAreErrors) {
  const std::string dir = write("tiny-moe", 1);
  const fs::path file = dir_ / "model.safetensors";
  const std::string expert = "model.layers.1.mlp.experts.5.up_proj.weight";
  auto load = [&] { load_checkpoint(*backend_, dir); };

  rewrite(file, [&](auto& v) { std::erase_if(v, [&](auto& t) { return t.name == expert; }); });
  expect_error(load, ErrorCode::kIo,
               {"missing tensor " + expert, "[128, 256]", "model.safetensors"});

  write("tiny-moe", 1);
  rewrite(file, [&](auto& v) {
    for (auto& t : v) {
      if (t.name == expert) t.shape = {256, 128};
    }
  });
  expect_error(load, ErrorCode::kIo, {expert, "has shape [256, 128]", "needs [128, 256]"});

  write("tiny-moe", 1);
  rewrite(file, [&](auto& v) {
    for (auto& t : v) {
      if (t.name == expert) t.dtype = StDtype::kI16;
    }
  });
  expect_error(load, ErrorCode::kIo, {expert, "dtype I16", "model.safetensors"});

  write("tiny-moe", 1, /*fp8=*/true);
  rewrite(file, [&](auto& v) {
    std::erase_if(v, [&](auto& t) { return t.name == expert + "_scale_inv"; });
  });
  expect_error(load, ErrorCode::kIo, {expert, "F8_E4M3", expert + "_scale_inv", "missing"});
}

TEST_F(CheckpointTest, ExtraTensorsWarnOrFailUnderStrict) {
  const std::string dir = write("tiny", 1);
  std::vector<uint8_t> extra(8, 1);
  rewrite(dir_ / "model.safetensors", [&](auto& v) {
    v.push_back({"model.layers.7.mtp.weight", StDtype::kBf16, {4}, extra});
  });
  EXPECT_NO_THROW(load_checkpoint(*backend_, dir));
  expect_error([&] { load_checkpoint(*backend_, dir, nullptr, {.strict = true}); }, ErrorCode::kIo,
               {"1 tensor(s)", "model.layers.7.mtp.weight"});
}

TEST_F(CheckpointTest, ShardAndIndexErrorsNameTheFile) {
  const std::string dir = write("tiny", 3);
  const fs::path index = dir_ / "model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
  const std::string name = "model.layers.1.self_attn.o_proj.weight";

  j["weight_map"][name] = "model-00009-of-00003.safetensors";
  std::ofstream(index) << j.dump();
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {name, "model-00009-of-00003.safetensors", "does not exist"});

  write("tiny", 3);
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {"model-00002-of-00003.safetensors", "does not exist"});

  write("tiny", 3);
  j = nlohmann::json::parse(std::ifstream(index));
  const std::string file = j["weight_map"][name];
  j["weight_map"][name] = file == "model-00001-of-00003.safetensors"
                              ? "model-00003-of-00003.safetensors"
                              : "model-00001-of-00003.safetensors";
  std::ofstream(index) << j.dump();
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {name, "has no such tensor"});

  std::ofstream(index) << "{\"weight_map\": ";
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {"model.safetensors.index.json", "not valid JSON"});
}

TEST_F(CheckpointTest, MissingConfigOrWeightsFileIsAnError) {
  expect_error([&] { load_checkpoint(*backend_, dir_.string()); }, ErrorCode::kIo,
               {dir_.string(), "does not exist"});
  const std::string dir = write("tiny", 1);
  fs::remove(dir_ / "model.safetensors");
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo,
               {"neither model.safetensors nor model.safetensors.index.json"});
  fs::remove(dir_ / "config.json");
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kIo, {"no config.json"});
  std::ofstream(dir_ / "config.json") << R"({"hidden_size": 0})";
  expect_error([&] { load_checkpoint(*backend_, dir); }, ErrorCode::kInvalidArgument,
               {"config.json", "hidden_size = 0"});
}

TEST_F(CheckpointTest, WriterRejectsBadShardCounts) {
  const ModelConfig config = preset_config("tiny");
  const Weights w = Weights::synthetic(*backend_, config, kSeed);
  for (int shards : {0, 1000}) {
    CheckpointWriteOptions o;
    o.shards = shards;
    expect_error([&] { write_checkpoint(*backend_, config, w, dir_.string(), o); },
                 ErrorCode::kInvalidArgument, {fmt::format("--shards = {}", shards)});
  }
}

}  // namespace
}  // namespace dsa
