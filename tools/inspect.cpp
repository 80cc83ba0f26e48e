// dsa inspect: what a checkpoint directory holds and what the model would use, read from its
// config.json and safetensors headers without loading tensor data.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "dsa/checkpoint.h"
#include "dsa/config.h"

namespace dsa::tools {
namespace {

nlohmann::json summary_json(const std::string& dir, const CheckpointSummary& s) {
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [name, d] : s.dtypes)
    dtypes[name] = {{"tensors", d.tensors}, {"bytes", d.bytes}};
  return {{"checkpoint", dir},
          {"config", config_to_json(s.config)},
          {"softmax_scale", s.config.softmax_scale()},
          {"files", s.files},
          {"tensors", s.tensors},
          {"tensor_bytes", s.tensor_bytes},
          {"dtypes", dtypes},
          {"manifest_tensors", s.manifest_tensors},
          {"unused_tensors", s.unused}};
}

std::string summary_text(const std::string& dir, const CheckpointSummary& s) {
  const ModelConfig& c = s.config;
  std::string out = fmt::format("checkpoint {}\n", dir);
  out += fmt::format("  files        {}\n", fmt::join(s.files, ", "));
  const int64_t scales = s.tensors - s.manifest_tensors - int64_t(s.unused.size());
  out += fmt::format(
      "  tensors      {} ({:.3f} GB): {} the config uses, {} fp8 block scales, {} unused\n",
      s.tensors, double(s.tensor_bytes) / 1e9, s.manifest_tensors, scales, s.unused.size());
  for (const auto& [name, d] : s.dtypes) {
    out += fmt::format("  dtype {:<8}{} tensors, {} bytes\n", name, d.tensors, d.bytes);
  }
  const int moe_layers = c.n_routed_experts > 0 ? c.num_hidden_layers - c.first_k_dense_replace : 0;
  out += fmt::format(
      "  model        {} layers ({} MoE), hidden {}, {} heads (qk {}+{}, v {}), q_lora {}, "
      "kv_lora {}, vocab {}\n",
      c.num_hidden_layers, moe_layers, c.hidden_size, c.num_attention_heads, c.qk_nope_head_dim,
      c.qk_rope_head_dim, c.v_head_dim, c.q_lora_rank, c.kv_lora_rank, c.vocab_size);
  out += fmt::format("  indexer      {} heads x {}, top-{}, rope {}\n", c.index_n_heads,
                     c.index_head_dim, c.index_topk,
                     c.indexer_rope_interleave ? "interleaved" : "half-split");
  if (c.n_routed_experts > 0) {
    out += fmt::format("  experts      {} routed (top-{}, x{}), {} shared, width {}\n",
                       c.n_routed_experts, c.num_experts_per_tok, c.routed_scaling_factor,
                       c.n_shared_experts, c.moe_intermediate_size);
  }
  const RopeScaling& r = c.rope_scaling;
  out += fmt::format("  rope         theta {}, {}\n", c.rope_theta,
                     r.type.empty()
                         ? std::string("no scaling")
                         : fmt::format("yarn x{} from {} (beta {}/{}, mscale {}/{})", r.factor,
                                       r.original_max_position_embeddings, r.beta_fast, r.beta_slow,
                                       r.mscale, r.mscale_all_dim));
  out += fmt::format("  context      {} positions, softmax scale {:.6g}, rms_norm_eps {}\n",
                     c.max_position_embeddings, c.softmax_scale(), c.rms_norm_eps);
  return out;
}

}  // namespace

void register_inspect(CLI::App& app, SubcommandAction& run) {
  struct Opts {
    std::string checkpoint;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "print a checkpoint's resolved config, tensor count and bytes, and dtypes");
  cmd->add_option("--checkpoint", o->checkpoint, "checkpoint directory")
      ->required()
      ->check(non_empty("a checkpoint directory"));
  cmd->add_flag("--json", o->json, "print JSON instead of text");
  cmd->callback([&run, o] {
    run = [o] {
      const CheckpointSummary s = inspect_checkpoint(o->checkpoint);
      if (o->json) {
        fmt::print("{}\n", summary_json(o->checkpoint, s).dump(2));
      } else {
        fmt::print("{}", summary_text(o->checkpoint, s));
      }
      return 0;
    };
  });
}

}  // namespace dsa::tools
