// An in-process dsa server on 127.0.0.1 and an ephemeral port (tiny preset on the CPU, the tiny
// tokenizer), and the HTTP helpers the server tests share. Every wait is bounded, so a broken
// server fails the test instead of hanging it.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsa/config.h"
#include "dsa/server.h"
#include "dsa/text/tokenizer.h"

namespace dsa::server::testing {

using nlohmann::json;

inline std::shared_ptr<const text::Tokenizer> tiny_tokenizer() {
  static const auto tok = [] {
    const auto files = text::builtin_tokenizer("tiny");
    return std::make_shared<const text::Tokenizer>(
        text::Tokenizer::from_json(files->tokenizer_json, files->tokenizer_config_json, "tiny"));
  }();
  return tok;
}

struct TinyOptions {
  int max_rows = 16;
  int max_running = 0;  // 0: max_rows
  int context = 512;
  int64_t pages = 64;
  RunMode mode = RunMode::kGraph;
  FaultSet faults;
  bool prefix_cache = false;  // dsa serve turns it on; the tests ask for it where they test it
};

// The tiny preset with the tiny tokenizer's 1024-id vocabulary and synthetic weights.
inline LoadedModel load_tiny(const TinyOptions& t) {
  LoadedModel m;
  m.backend = make_backend(BackendKind::kCpu);
  ModelConfig config = preset_config("tiny");
  m.tokenizer = tiny_tokenizer();
  config.vocab_size = m.tokenizer->vocab_size();
  m.model = std::make_unique<Model>(*m.backend, config, Weights::synthetic(*m.backend, config, 3),
                                    t.max_rows, t.context);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = t.pages;
  m.cache = std::make_unique<KvCache>(*m.backend, cc);
  m.engine.runner.mode = t.mode;
  m.engine.runner.faults = t.faults;
  m.engine.max_running = t.max_running;
  m.engine.prefix_cache = t.prefix_cache;
  return m;
}

// Polls until pred() holds; false after `seconds`.
inline bool eventually(const std::function<bool()>& pred, double seconds = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class TestServer {
 public:
  explicit TestServer(ServerOptions options = {}, TinyOptions tiny = {},
                      std::function<void()> before_load = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<Server>(options, [tiny, before_load] {
      if (before_load) before_load();
      return load_tiny(tiny);
    });
    server_->start();
  }
  ~TestServer() { server_->stop(); }

  int port() const { return server_->port(); }
  Server& server() { return *server_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120);
    c.set_write_timeout(120);
    return c;
  }
  bool wait_ready() {
    return eventually([&] { return server_->snapshot().ready; });
  }
  // Idle: nothing in flight and every page back in the pool.
  bool wait_idle() {
    return eventually([&] {
      const ServerSnapshot s = server_->snapshot();
      return s.in_flight == 0 && s.running == 0 && s.waiting == 0;
    });
  }
  httplib::Result post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) const {
    return client().Post(path.c_str(), headers, body, "application/json");
  }
  httplib::Result post(const std::string& path, const json& body) const {
    return post(path, body.dump());
  }

 private:
  std::unique_ptr<Server> server_;
};

// The events of an SSE body: the payload after "data: " of each "\n\n"-terminated event. Fails
// the test on any framing fault.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << "an event that is not 'data: ...': " << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << "a multi-line event: " << event;
    events.push_back(event.substr(6));
    pos = end + 2;
  }
  return events;
}

}  // namespace dsa::server::testing
