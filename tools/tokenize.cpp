// dsa tokenize: text -> token ids with a checkpoint's, a file's or a preset's tokenizer.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "dsa/error.h"

namespace dsa::tools {

void register_tokenize(CLI::App& app, Runner& run) {
  struct Opts {
    TokenizerSource source;
    std::string text, file;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text");
  add_tokenizer_options(cmd, o->source);
  auto* text = cmd->add_option("--text", o->text, "the text");
  cmd->add_option("--file", o->file, "read the text from a file")->excludes(text);
  cmd->add_flag("--json", o->json, "print a JSON array");
  cmd->callback([&run, o] {
    run = [o] {
      require(!o->text.empty() || !o->file.empty(), ErrorCode::kInvalidArgument,
              "give the text with --text S or --file F");
      const text::Tokenizer tok = load_tokenizer(o->source);
      const std::string input = o->file.empty() ? o->text : read_input_file(o->file, "--file");
      const std::vector<int32_t> ids = tok.encode(input);
      if (o->json) {
        fmt::print("[{}]\n", fmt::join(ids, ", "));
      } else {
        fmt::print("{}\n", fmt::join(ids, " "));
      }
      return 0;
    };
  });
}

}  // namespace dsa::tools
