// The server's endpoints over the shared state that HTTP threads see.
#pragma once

#include <atomic>

#include "dsa/server.h"
#include "server/engine_loop.h"
#include "server/ids.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace dsa::server {

struct RouteContext {
  explicit RouteContext(ServerOptions o)
      : options(std::move(o)),
        loop(metrics, options.max_queue),
        created(std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count()) {}
  ServerOptions options;
  Metrics metrics;
  EngineLoop loop;
  IdSource ids;
  int64_t created;  // unix seconds, for /v1/models
  std::atomic<bool> stopping{false};
};

void install_routes(httplib::Server& http, RouteContext& ctx);

}  // namespace dsa::server
