// dsa write-checkpoint: writes a preset's synthetic weights as a Hugging Face style checkpoint
// (config.json + safetensors, sharded with an index) plus the preset's tokenizer (tokenizer.json +
// tokenizer_config.json), which --checkpoint DIR loads back.
#include "dsa/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "common.h"
#include "dsa/config.h"
#include "dsa/error.h"

namespace dsa::tools {
namespace {

// Every preset carries the built-in tiny tokenizer: its 1024 ids are the whole vocabulary of the
// tiny presets and fit in v32's 32768 (whose embedding rows past 1024 are padding, as DeepSeek's
// 129280 rows pad its 128815 tokens).
void write_tokenizer(std::string_view preset, const std::filesystem::path& dir) {
  const auto files = text::builtin_tokenizer(preset_tokenizer_name(preset));
  require(files.has_value(), ErrorCode::kInternal, "no built-in tokenizer for preset '{}'", preset);
  for (const auto& [name, contents] :
       {std::pair{"tokenizer.json", files->tokenizer_json},
        std::pair{"tokenizer_config.json", files->tokenizer_config_json}}) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(contents.data(), std::streamsize(contents.size()));
    require(out.good(), ErrorCode::kIo, "cannot write {}", (dir / name).string());
  }
}

}  // namespace

void register_write_checkpoint(CLI::App& app, Runner& run) {
  struct Opts {
    std::string preset = "tiny", out;
    int shards = 1;
    bool fp8 = false;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "write-checkpoint", "write a preset's synthetic weights as config.json + safetensors");
  cmd->add_option("--preset", o->preset, "model preset: tiny | tiny-moe | v32")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "checkpoint directory to write (created)")->required();
  cmd->add_option("--shards", o->shards, "safetensors files (more than 1 adds the index)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--fp8", o->fp8, "store 2-D projections as F8_E4M3 with 128x128 block scales");
  cmd->add_option("--seed", o->seed, "synthetic weight seed")->capture_default_str();
  cmd->callback([&run, o] {
    run = [o] {
      const ModelConfig config = preset_config(o->preset);
      auto backend = make_cpu_backend();
      const Weights weights = Weights::synthetic(*backend, config, o->seed);
      write_checkpoint(*backend, config, weights, o->out, {o->shards, o->fp8});
      write_tokenizer(o->preset, o->out);
      fmt::print("wrote checkpoint {}: preset {}, {} tensors, {} shard(s){}, tokenizer '{}'\n",
                 o->out, o->preset, weights.tensors().size(), o->shards, o->fp8 ? ", fp8" : "",
                 preset_tokenizer_name(o->preset));
      return 0;
    };
  });
}

}  // namespace dsa::tools
