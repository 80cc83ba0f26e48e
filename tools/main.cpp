// The dsa program: one subcommand per file in tools/. Logs go to stderr; stdout carries only the
// command's results. Exit statuses: exit_status_help() in common.cpp.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "common.h"
#include "dsa/error.h"

namespace {

// Runs the chosen command and maps every way it can end to an exit status.
int run_command(const dsa::tools::SubcommandAction& run) {
  try {
    return run();
  } catch (const dsa::Error& e) {
    fmt::print(stderr, "dsa: error: {}\n", e.what());
    return dsa::exit_status(e.code());
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "dsa: error: out of memory (an allocation failed mid-run; the up-front estimate "
               "did not catch it)\n");
    return dsa::kExitRuntime;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsa: internal error: {}\n", e.what());
    return dsa::kExitInternal;
  }
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "", std::make_shared<spdlog::sinks::stderr_color_sink_mt>()));
  CLI::App app{"dsa: DeepSeek Sparse Attention inference runtime"};
  app.require_subcommand(1);
  app.footer(dsa::tools::exit_status_help());
  std::string log_level = "warn";
  app.add_option("--log", log_level, "log level (to stderr)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  dsa::tools::SubcommandAction run;
  dsa::tools::register_generate(app, run);
  dsa::tools::register_write_checkpoint(app, run);
  dsa::tools::register_inspect(app, run);
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
    return code == 0 ? 0 : dsa::kExitBadInput;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  int status = run ? run_command(run) : dsa::kExitBadInput;
  // Results written to a full or closed stdout are lost: that is a failed run, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "dsa: error: writing the results to standard output failed: {}\n",
               std::strerror(errno));
    status = dsa::kExitWrite;
  }
  return status;
}
