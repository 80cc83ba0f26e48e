// dsa detokenize: token ids -> text (the tokens' exact bytes).
#include <fmt/format.h>

#include "common.h"
#include "dsa/error.h"

namespace dsa::tools {

void register_detokenize(CLI::App& app, Runner& run) {
  struct Opts {
    TokenizerSource source;
    std::string ids;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("detokenize", "print the text of token ids");
  add_tokenizer_options(cmd, o->source);
  cmd->add_option("--ids", o->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  cmd->callback([&run, o] {
    run = [o] {
      const text::Tokenizer tok = load_tokenizer(o->source);
      const std::vector<int32_t> ids =
          parse_ids(o->ids, "--ids", tok.vocab_size(), "the tokenizer's vocabulary");
      const std::string out = tok.decode(ids);
      fmt::print("{}\n", out);
      return 0;
    };
  });
}

}  // namespace dsa::tools
