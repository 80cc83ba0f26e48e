// dsa write-checkpoint: writes a preset's synthetic weights as a Hugging Face style checkpoint
// (config.json + safetensors, sharded with an index) plus the preset's tokenizer (tokenizer.json +
// tokenizer_config.json), which --checkpoint DIR loads back.
#include "dsa/checkpoint.h"

#include <fmt/format.h>

#include <map>

#include "common.h"
#include "dsa/config.h"
#include "dsa/error.h"

namespace dsa::tools {
namespace {

// Every preset carries the built-in tiny tokenizer: its 1024 ids are the whole vocabulary of the
// tiny presets and fit in v32's 32768 (whose embedding rows past 1024 are padding, as DeepSeek's
// 129280 rows pad its 128815 tokens). The files go into the checkpoint with its weights, so a
// rewritten checkpoint never keeps another one's tokenizer.
std::map<std::string, std::string> tokenizer_files(std::string_view preset) {
  const auto files = text::builtin_tokenizer(preset_tokenizer_name(preset));
  require(files.has_value(), ErrorCode::kInternal, "no built-in tokenizer for preset '{}'", preset);
  return {{"tokenizer.json", std::string(files->tokenizer_json)},
          {"tokenizer_config.json", std::string(files->tokenizer_config_json)}};
}

}  // namespace

void register_write_checkpoint(CLI::App& app, SubcommandAction& run) {
  struct Opts {
    std::string preset = "tiny", out;
    int shards = 1;
    bool fp8 = false, force = false;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "write-checkpoint", "write a preset's synthetic weights as config.json + safetensors");
  cmd->add_option("--preset", o->preset, "model preset: tiny | tiny-moe | v32")
      ->capture_default_str();
  cmd->add_option("--out", o->out,
                  "checkpoint directory to write: written beside it, then renamed into place")
      ->required()
      ->check(non_empty("a directory name"));
  add_int_option(cmd, "--shards", o->shards, 1, 1000,
                 "safetensors files (more than 1 adds the index)");
  cmd->add_flag("--fp8", o->fp8, "store 2-D projections as F8_E4M3 with 128x128 block scales");
  cmd->add_flag("--force", o->force,
                "replace a non-empty --out directory as a whole (none of its files survive)");
  add_seed_option(cmd, "--seed", o->seed, "synthetic weight seed");
  cmd->callback([&run, o] {
    run = [o] {
      const ModelConfig config = preset_config(o->preset);
      auto backend = make_cpu_backend();
      const Weights weights = Weights::synthetic(*backend, config, o->seed);
      CheckpointWriteOptions wo;
      wo.shards = o->shards;
      wo.fp8 = o->fp8;
      wo.existing = o->force ? ExistingCheckpoint::kReplace : ExistingCheckpoint::kRefuse;
      wo.extra_files = tokenizer_files(o->preset);
      write_checkpoint(*backend, config, weights, o->out, wo);
      fmt::print("wrote checkpoint {}: preset {}, {} tensors, {} shard(s){}, tokenizer '{}'\n",
                 o->out, o->preset, weights.tensors().size(), o->shards, o->fp8 ? ", fp8" : "",
                 preset_tokenizer_name(o->preset));
      return 0;
    };
  });
}

}  // namespace dsa::tools
