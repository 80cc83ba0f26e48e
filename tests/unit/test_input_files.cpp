// Files in and out: inputs must be regular files (a FIFO never hangs a load), JSON nesting is
// bounded before parsing, every output write is checked (ENOSPC names the file), a rewritten
// checkpoint never keeps another one's files, and a configuration's memory is refused before it
// is allocated.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/expect_error.h"
#include "dsa/checkpoint.h"
#include "dsa/error.h"
#include "dsa/file_io.h"
#include "dsa/model.h"
#include "model/safetensors.h"

namespace dsa {
namespace {

namespace fs = std::filesystem;
using ::dsa::testing::expect_error;

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("dsa_files_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    backend_ = make_cpu_backend();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const fs::path& out, uint64_t seed, int shards,
             ExistingCheckpoint existing = ExistingCheckpoint::kRefuse) {
    const ModelConfig config = preset_config("tiny");
    CheckpointWriteOptions o;
    o.shards = shards;
    o.existing = existing;
    write_checkpoint(*backend_, config, Weights::synthetic(*backend_, config, seed), out.string(),
                     o);
  }
  std::vector<std::string> entries(const fs::path& d) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(InputFiles, FifosAndDevicesAreRefusedNotRead) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens the FIFO: a blocking open or read would hang here.
  expect_error([&] { SafetensorsFile f(fifo.string()); }, ErrorCode::kIo, {"pipe", "a FIFO"});
  expect_error([&] { read_regular_file(fifo.string(), 100, "--prompt-file"); }, ErrorCode::kIo,
               {"--prompt-file", "a FIFO; expected a regular file"});
  expect_error([&] { read_regular_file("/dev/zero", 100, "--prompt-file"); }, ErrorCode::kIo,
               {"/dev/zero is a character device"});
  expect_error([&] { read_regular_file(dir_.string(), 100, "prompt"); }, ErrorCode::kIo,
               {"is a directory"});
  std::ofstream(dir_ / "big") << std::string(101, 'x');
  expect_error([&] { read_regular_file((dir_ / "big").string(), 100, "prompt"); }, ErrorCode::kIo,
               {"101 bytes; the limit is 100"});
  EXPECT_EQ(read_regular_file((dir_ / "big").string(), 101, "prompt").size(), 101u);

  // A FIFO as config.json, as a shard, or as model.safetensors.
  write(dir_ / "ck", 1, 3);
  fs::remove(dir_ / "ck" / "config.json");
  ASSERT_EQ(::mkfifo((dir_ / "ck" / "config.json").c_str(), 0600), 0);
  expect_error([&] { load_checkpoint_config((dir_ / "ck").string()); }, ErrorCode::kIo,
               {"config.json is a FIFO"});
  write(dir_ / "ck", 1, 3, ExistingCheckpoint::kReplace);
  const fs::path shard = dir_ / "ck" / "model-00002-of-00003.safetensors";
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  expect_error([&] { load_checkpoint(*backend_, (dir_ / "ck").string()); }, ErrorCode::kIo,
               {"model-00002-of-00003.safetensors is a FIFO"});
}

TEST_F(InputFiles, DeepJsonNestingIsRefusedBeforeParsing) {
  // 100,000 nested '[' in a shape: a recursive reader would overflow the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string header =
      R"({"a":{"dtype":"BF16","shape":)" + deep + R"(,"data_offsets":[0,2]}})";
  expect_error([&] { parse_safetensors_header(header, 2, "x.safetensors"); }, ErrorCode::kIo,
               {"x.safetensors", "nests more than 8 levels"});
  std::ofstream(dir_ / "config.json") << "{\"hidden_size\": " << deep << "}";
  expect_error([&] { load_checkpoint_config(dir_.string()); }, ErrorCode::kIo,
               {"config.json", "nests more than 16 levels"});
  // Brackets inside strings do not count.
  const std::string quoted = R"({"__metadata__":{"k":"[[[[[[[[[[[[[[[[[[[["}})";
  EXPECT_EQ(parse_safetensors_header(quoted, 0, "q").metadata.at("k"), "[[[[[[[[[[[[[[[[[[[[");
}

TEST_F(InputFiles, IndexFileNamesWithNulAreRefused) {
  write(dir_ / "ck", 1, 3);
  const fs::path index = dir_ / "ck" / "model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  j["weight_map"][name] = std::string("model-00001-of-00003.safetensors\0.x", 36);
  std::ofstream(index, std::ios::trunc) << j.dump();
  expect_error([&] { load_checkpoint(*backend_, (dir_ / "ck").string()); }, ErrorCode::kIo,
               {name, "not a file name"});
}

TEST_F(InputFiles, ARewrittenCheckpointKeepsNoFileOfTheOldOne) {
  const fs::path out = dir_ / "ck";
  write(out, 1, 3);
  const auto sharded = entries(out);
  EXPECT_EQ(sharded.size(), 5u);  // config, index, 3 shards
  // Without replace: refused, and the old checkpoint is untouched.
  expect_error([&] { write(out, 2, 1); }, ErrorCode::kInvalidArgument, {"is not empty", "--force"});
  EXPECT_EQ(entries(out), sharded);
  // With replace: exactly the new checkpoint's files, and its weights load.
  write(out, 2, 1, ExistingCheckpoint::kReplace);
  EXPECT_EQ(entries(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const ModelConfig config = preset_config("tiny");
  const Weights loaded = load_checkpoint(*backend_, out.string());
  const Weights seed2 = Weights::synthetic(*backend_, config, 2);
  const std::string t = "model.embed_tokens.weight";
  std::vector<Bf16> a(size_t(loaded.tensors().at(t).numel())), b(a.size());
  backend_->copy_to_host(a.data(), loaded.tensors().at(t).data.data(), a.size() * sizeof(Bf16));
  backend_->copy_to_host(b.data(), seed2.tensors().at(t).data.data(), b.size() * sizeof(Bf16));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(Bf16)), 0);
  // No temporary directory is left beside it.
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"ck"}));
  // A directory that holds both layouts is refused rather than read by the index.
  write(dir_ / "three", 1, 3);
  fs::copy_file(out / "model.safetensors", dir_ / "three" / "model.safetensors");
  expect_error([&] { load_checkpoint(*backend_, (dir_ / "three").string()); }, ErrorCode::kIo,
               {"holds both"});
}

TEST_F(InputFiles, WriteErrorsNameTheFile) {
  expect_error([] { write_output_file("/dev/full", "results\n", "--json file"); },
               ErrorCode::kWriteFailed, {"--json file /dev/full", "No space left on device"});
  expect_error([] { write_output_file("/nonexistent/dir/b.json", "{}", "--json file"); },
               ErrorCode::kWriteFailed, {"/nonexistent/dir/b.json cannot be created"});
  const std::vector<uint8_t> bytes(64, 1);
  expect_error(
      [&] {
        write_safetensors("/dev/full", {{"a", StDtype::kBf16, {32}, bytes}}, {});
      },
      ErrorCode::kWriteFailed, {"safetensors file /dev/full", "No space left on device"});

  // A full disk while config.json is written (a file size limit stands in for ENOSPC): the write
  // fails naming config.json, and nothing appears at the target or beside it.
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  expect_error([&] { write(dir_ / "ck", 1, 1); }, ErrorCode::kWriteFailed,
               {"checkpoint config", "config.json", "failed after"});
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(entries(dir_).empty());
}

TEST(MemoryEstimate, RefusesBeforeAllocatingAndNamesTheNeedAndTheLimit) {
  const ModelConfig config = preset_config("tiny");
  CacheConfig cache;
  cache.num_layers = config.num_hidden_layers;
  cache.num_pages = int64_t(1) << 30;
  const MemoryEstimate e = estimate_memory(config, 64, 1024, cache);
  // Each page holds 64 tokens of bf16 latent (576 x 2 bytes) and index-K (128 x 2) per layer.
  EXPECT_EQ(e.cache, (uint64_t(1) << 30) * (2 * 64 * (576 * 2 + 128 * 2) + 5));
  expect_error(
      [&] { require_memory_fits(e, config, cache, uint64_t(16) << 30, "this run", "cpu"); },
      ErrorCode::kOutOfRange,
      {"this run needs 193519.4 GB", "1073741824 pages x 2 layers", "the cpu has 17.2 GB"});
  cache.num_pages = 100;
  EXPECT_NO_THROW(require_memory_fits(estimate_memory(config, 64, 1024, cache), config, cache,
                                      uint64_t(16) << 30, "this run", "cpu"));
  // Sizes past 2^64 saturate instead of wrapping to something small.
  cache.num_pages = int64_t(1) << 62;
  cache.num_layers = 1 << 20;
  EXPECT_EQ(estimate_memory(config, 64, 1024, cache).total(), UINT64_MAX);
}

TEST(ExitStatus, EachErrorCodeHasItsDocumentedStatus) {
  EXPECT_EQ(exit_status(ErrorCode::kInvalidArgument), 2);
  EXPECT_EQ(exit_status(ErrorCode::kOutOfRange), 2);
  EXPECT_EQ(exit_status(ErrorCode::kIo), 2);  // a malformed checkpoint is bad input, not 1
  EXPECT_EQ(exit_status(ErrorCode::kResourceExhausted), 2);
  EXPECT_EQ(exit_status(ErrorCode::kBackend), 3);
  EXPECT_EQ(exit_status(ErrorCode::kWriteFailed), 4);
  EXPECT_EQ(exit_status(ErrorCode::kInternal), 5);
  EXPECT_EQ(kExitCorruption, 1);
}

}  // namespace
}  // namespace dsa
