// dsa write-checkpoint: writes a preset's synthetic weights as a Hugging Face style checkpoint
// (config.json + safetensors, sharded with an index), which --checkpoint DIR loads back.
#include <fmt/format.h>

#include "common.h"
#include "dsa/checkpoint.h"
#include "dsa/config.h"

namespace dsa::tools {

void register_write_checkpoint(CLI::App& app, SubcommandAction& run) {
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
      fmt::print("wrote checkpoint {}: preset {}, {} tensors, {} shard(s){}\n", o->out,
                 o->preset, weights.tensors().size(), o->shards, o->fp8 ? ", fp8" : "");
      return 0;
    };
  });
}

}  // namespace dsa::tools
