// The dsa program: one subcommand per file in tools/.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "common.h"
#include "dsa/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dsa: DeepSeek Sparse Attention inference runtime"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log", log_level, "log level: trace|debug|info|warn|error")
      ->capture_default_str();
  dsa::tools::Runner run;
  dsa::tools::register_generate(app, run);
  dsa::tools::register_write_checkpoint(app, run);
  dsa::tools::register_stress(app, run);
  dsa::tools::register_check_replay(app, run);
  dsa::tools::register_bench_decode(app, run);
  dsa::tools::register_serve(app, run);
  dsa::tools::register_bench_serve(app, run);
  dsa::tools::register_bench_engine(app, run);
  dsa::tools::register_tokenize(app, run);
  dsa::tools::register_detokenize(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;  // bad usage
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    return run ? run() : 2;
  } catch (const dsa::Error& e) {
    fmt::print(stderr, "dsa: error: {}\n", e.what());
    return e.code() == dsa::ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsa: error: {}\n", e.what());
    return 1;
  }
}
