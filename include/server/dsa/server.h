// dsa serve: an OpenAI-compatible HTTP server over the engine (cpp-httplib + nlohmann-json).
//
// Threads: HTTP worker threads parse and validate requests and enqueue them; one engine thread
// loads the model, then owns the model, the cache and the engine, and steps it. Each request
// streams from its own channel; no lock is held across a model step. The server listens before
// the model is loaded: /health answers 503 until the engine thread is ready.
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize,
// POST /detokenize, GET /health, GET /metrics (Prometheus text, "dsa:" names).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dsa/backend.h"
#include "dsa/cache.h"
#include "dsa/engine.h"
#include "dsa/model.h"

namespace dsa::text {
class Tokenizer;
}

namespace dsa::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                        // 0: an ephemeral port, see Server::port()
  std::string api_key;                    // non-empty: API routes need "Authorization: Bearer KEY"
  std::string served_model_name = "dsa";  // the one model id /v1/models lists
  int max_queue = 256;                    // requests accepted beyond the running set; more: 429
  size_t max_body_bytes = size_t(4) << 20;  // larger request bodies: 413
  int http_threads = 128;                   // connections served at once
  int default_max_tokens = 256;             // when a request names none (capped by the context)
  std::string fault_injection;  // non-empty (the faults' names): announced on every response
};

// What the engine thread loads and then owns. The tokenizer's vocabulary must fit the model's.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  EngineOptions engine;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};
using ModelLoader = std::function<LoadedModel()>;

// A view of the engine for tests and the log: refreshed by the engine thread after every step.
struct ServerSnapshot {
  bool ready = false;
  std::string load_error;                                     // non-empty when loading failed
  int64_t free_pages = 0, cached_pages = 0, total_pages = 0;  // cached: prefix cache only
  int64_t running = 0, waiting = 0;
  int64_t in_flight = 0;  // accepted and not yet finished, queued to the engine thread included
  EngineStats stats;
};

class Server {
 public:
  Server(ServerOptions options, ModelLoader loader);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving, then loads the model on the engine thread. Returns once the socket
  // listens (kIo when the address cannot be bound); the model may still be loading.
  void start();
  int port() const;
  // Blocks until stop() or a failed load; returns the load error (empty after stop()).
  std::string wait();
  void stop();
  ServerSnapshot snapshot() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsa::server
