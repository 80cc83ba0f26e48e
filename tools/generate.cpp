// dsa generate: greedy, deterministic decode of one prompt, printed as text through the
// tokenizer's stream decoder.
#include "dsa/generate.h"

#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "common.h"
#include "dsa/checkpoint.h"
#include "dsa/config.h"
#include "dsa/error.h"
#include "dsa/runner.h"
#include "generate_chat.h"

namespace dsa::tools {
namespace {

struct GenerateOpts {
  ModelOptions model;
  std::string prompt, prompt_file, prompt_ids, mode = "eager", inject;
  std::string chat, chat_format = "v32";  // --chat: a chat request rendered in this format
  bool byte_tokens = false;
  int max_tokens = 32;
};

// The prompt's ids, from exactly one source: --prompt / --prompt-file (text, tokenized, or one
// token per byte with --byte-tokens) or --prompt-ids. (--chat is rendered and tokenized apart.)
std::vector<int32_t> prompt_tokens(const GenerateOpts& o, const std::optional<text::Tokenizer>& tok,
                                   int32_t vocab) {
  if (!o.prompt_ids.empty())
    return parse_ids(o.prompt_ids, "--prompt-ids", vocab, "the model's vocabulary");
  const std::string text =
      o.prompt_file.empty() ? o.prompt : read_input_file(o.prompt_file, "--prompt-file");
  require(!text.empty(), ErrorCode::kInvalidArgument,
          "give a prompt with --prompt TEXT, --prompt-file PATH or --prompt-ids 1,2,3");
  if (o.byte_tokens) {
    require(vocab >= 256, ErrorCode::kInvalidArgument,
            "--byte-tokens needs a vocabulary of at least 256 ids, the model has {}", vocab);
    return byte_tokens(text);
  }
  return tok->encode(text);
}

// Decoded text of the generated ids. Ids past the tokenizer's vocabulary (a model whose
// embedding is padded beyond it, as v32's) print as [id N] and are counted on stderr.
std::string decode_output(const text::Tokenizer& tok, std::span<const int32_t> ids) {
  text::StreamDecoder decoder(tok);
  std::string out;
  int unknown = 0;
  for (const int32_t id : ids) {
    if (id < tok.vocab_size()) {
      out += decoder.push(id);
    } else {
      out += decoder.finish();
      out += fmt::format("[id {}]", id);
      ++unknown;
    }
  }
  out += decoder.finish();
  if (unknown > 0)
    fmt::print(stderr, "warning: {} generated id(s) are past the tokenizer's {} ids\n", unknown,
               tok.vocab_size());
  return out;
}

}  // namespace

void register_generate(CLI::App& app, Runner& run) {
  auto o = std::make_shared<GenerateOpts>();
  CLI::App* cmd = app.add_subcommand("generate", "greedy decode of one prompt");
  add_model_options(cmd, o->model);
  auto* prompt = cmd->add_option("--prompt", o->prompt, "prompt text (tokenized)");
  auto* file = cmd->add_option("--prompt-file", o->prompt_file, "read the prompt text from a file")
                   ->check(CLI::ExistingFile)
                   ->excludes(prompt);
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "the prompt as token ids: 1,2,3")
                  ->excludes(prompt)
                  ->excludes(file);
  cmd->add_flag("--byte-tokens", o->byte_tokens,
                "one token per prompt byte, output ids printed as bytes (no tokenizer)")
      ->excludes(ids);
  cmd->add_option("--chat", o->chat,
                  "a chat request body (JSON: messages, optional tools, thinking), rendered in "
                  "the DeepSeek chat format; prints the text, then the parsed message as JSON")
      ->excludes(prompt)
      ->excludes(file)
      ->excludes(ids)
      ->excludes("--byte-tokens");
  cmd->add_option("--chat-format", o->chat_format, "v32 | v4")->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--mode", o->mode, "eager | graph")->capture_default_str();
  cmd->add_option("--inject", o->inject, "faults: stale-padding,unguarded-store (testing only)");
  cmd->callback([&run, o] {
    run = [o] {
      require(o->mode == "eager" || o->mode == "graph", ErrorCode::kInvalidArgument,
              "--mode must be eager or graph, got '{}'", o->mode);
      const ModelConfig config = o->model.checkpoint.empty()
                                     ? preset_config(o->model.preset)
                                     : load_checkpoint_config(o->model.checkpoint);
      std::optional<text::Tokenizer> tok;
      if (!o->byte_tokens) {
        tok = load_tokenizer({o->model.checkpoint, "", o->model.preset});
        require(tok->vocab_size() <= config.vocab_size, ErrorCode::kInvalidArgument,
                "the tokenizer has {} ids, more than the model's vocab_size {}", tok->vocab_size(),
                config.vocab_size);
      }
      std::optional<ChatPrompt> chat;
      if (!o->chat.empty()) chat = read_chat_prompt(o->chat, o->chat_format);
      const std::vector<int32_t> prompt_ids =
          chat ? tok->encode(chat->text) : prompt_tokens(*o, tok, config.vocab_size);
      const int32_t stop = tok && tok->eos_id() ? *tok->eos_id() : -1;

      ModelStack stack = build_model_stack(o->model);
      RunnerOptions ro;
      ro.mode = o->mode == "graph" ? RunMode::kGraph : RunMode::kEager;
      ro.faults = parse_faults(o->inject);
      ro.buckets.erase(std::remove_if(ro.buckets.begin(), ro.buckets.end(),
                                      [&](int b) { return b > o->model.max_rows; }),
                       ro.buckets.end());
      dsa::Runner runner(*stack.model, *stack.cache, ro);
      GenerateStats stats;
      const auto t0 = std::chrono::steady_clock::now();
      const auto out = generate_greedy(runner, *stack.cache, *stack.model, prompt_ids,
                                       o->max_tokens, stop, &stats);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (chat) {  // the text without its end-of-sentence token, then the parsed message
        const bool stopped = !out.empty() && out.back() == stop;
        const std::string text =
            decode_output(*tok, std::span(out).first(out.size() - (stopped ? 1 : 0)));
        fmt::print("{}\n{}\n", text, chat_result_json(*chat, text, !stopped).dump());
      } else {
        fmt::print("{}\n", tok ? decode_output(*tok, out) : byte_text(out));
      }
      fmt::print(stderr,
                 "generated {} tokens after a {}-token prompt in {:.3f} s ({:.1f} tok/s) on {} | "
                 "preset {}, index-K {}, latent {}, mode {}, store errors {}\n",
                 stats.new_tokens, stats.prompt_tokens, s, stats.new_tokens / s,
                 stack.backend->describe(), o->model.preset, o->model.index_k, o->model.latent,
                 o->mode, stats.store_errors);
      return stats.store_errors == 0 ? 0 : 1;
    };
  });
}

}  // namespace dsa::tools
