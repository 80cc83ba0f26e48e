// dsa serve: the OpenAI-compatible HTTP server over the engine (src/server/).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <thread>

#include "common.h"
#include "dsa/error.h"
#include "dsa/server.h"
#include "dsa/text/tokenizer.h"

namespace dsa::tools {
namespace {

struct ServeOpts {
  ModelOptions model;
  server::ServerOptions server;
  std::string mode = "graph", inject, tokenizer;
  bool allow_fault_injection = false, audit = false, no_prefix_cache = false;
  int max_running = 0;
};

int run_serve(ServeOpts& o) {
  require(o.mode == "eager" || o.mode == "graph", ErrorCode::kInvalidArgument,
          "--mode must be eager or graph, got '{}'", o.mode);
  const FaultSet faults = parse_faults(o.inject);
  require(!faults.any() || o.allow_fault_injection, ErrorCode::kInvalidArgument,
          "--inject {} corrupts sessions on purpose; the server refuses it unless "
          "--allow-fault-injection is also given",
          o.inject);
  if (faults.any()) o.server.fault_injection = faults.describe();

  // SIGINT and SIGTERM stop the server cleanly; every thread started from here inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The tokenizer: --tokenizer FILE, else the checkpoint's, else the preset's built-in one. Read
  // before listening: a missing or bad file is a usage error.
  auto tokenizer = std::make_shared<const text::Tokenizer>(
      load_tokenizer(TokenizerSource{o.model.checkpoint, o.tokenizer, o.model.preset}));
  server::ModelLoader loader = [o, faults, tokenizer] {
    ModelStack stack = build_model_stack(o.model);
    server::LoadedModel m;
    m.engine.runner.mode = o.mode == "graph" ? RunMode::kGraph : RunMode::kEager;
    m.engine.runner.faults = faults;
    m.engine.max_running = o.max_running;
    m.engine.audit = o.audit;
    m.engine.prefix_cache = !o.no_prefix_cache;
    m.backend = std::move(stack.backend);
    m.model = std::move(stack.model);
    m.cache = std::move(stack.cache);
    m.tokenizer = tokenizer;
    return m;
  };
  server::Server srv(o.server, loader);
  srv.start();
  fmt::print("dsa serve: listening on http://{}:{} (model {}, loading)\n", o.server.host,
             srv.port(), o.server.served_model_name);
  std::fflush(stdout);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("serve: signal {}: stopping", sig);
    srv.stop();
  });
  const std::string error = srv.wait();
  if (!error.empty()) {
    fmt::print(stderr, "dsa serve: the model failed to load: {}\n", error);
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    return 1;
  }
  waiter.join();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, SubcommandAction& run) {
  auto o = std::make_shared<ServeOpts>();
  o->model.max_rows = 64;
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /metrics)");
  add_model_options(cmd, o->model);
  cmd->add_option("--host", o->server.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--mode", o->mode, "decode runner: graph | eager")->capture_default_str();
  cmd->add_option("--max-running", o->max_running, "requests decoding at once (0: --max-rows)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--max-queue", o->server.max_queue,
                  "requests queued beyond the running ones; more get 429")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "largest request body (413 above)")
      ->capture_default_str()
      ->check(CLI::Range(size_t(1024), size_t(1) << 30));
  cmd->add_option("--http-threads", o->server.http_threads, "connections served at once")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  cmd->add_option("--default-max-tokens", o->server.default_max_tokens,
                  "max_tokens of a request that names none")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--api-key", o->server.api_key, "require 'Authorization: Bearer KEY'");
  cmd->add_option("--served-model-name", o->server.served_model_name, "the model id clients use")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a tokenizer.json (default: the checkpoint's, or the preset's built-in one)");
  cmd->add_option("--inject", o->inject,
                  "faults: stale-padding,unguarded-store or incident (needs "
                  "--allow-fault-injection)");
  cmd->add_flag("--allow-fault-injection", o->allow_fault_injection,
                "allow --inject: every response then carries X-Dsa-Fault-Injection");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "turn the prefix cache off: every request prefills its whole prompt");
  cmd->add_flag("--audit", o->audit, "run the slot-integrity auditor (dsa:auditor_findings_total)");
  cmd->callback([&run, o] { run = [o] { return run_serve(*o); }; });
}

}  // namespace dsa::tools
