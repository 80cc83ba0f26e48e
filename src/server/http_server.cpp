// The HTTP side of dsa serve: routes, authentication, body limits, errors, SSE framing.
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "dsa/error.h"
#include "dsa/server.h"
#include "dsa/text/tokenizer.h"
#include "server/api_error.h"
#include "server/engine_loop.h"
#include "server/generation.h"
#include "server/ids.h"
#include "server/metrics.h"
#include "server/request_parse.h"
#include "server/routes.h"

namespace dsa::server {

using nlohmann::json;

namespace {

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

const char* status_message(int status) {
  switch (status) {
    case 400:
      return "the request is malformed";
    case 404:
      return "no such route";
    case 405:
      return "method not allowed";
    case 413:
      return "the request body is larger than the server accepts";
    default:
      return "the request failed";
  }
}

}  // namespace

struct Server::Impl : RouteContext {
  Impl(ServerOptions o, ModelLoader l) : RouteContext(std::move(o)), loader(std::move(l)) {}

  void install();

  ModelLoader loader;
  httplib::Server http;
  int listen_fd = -1;  // the listening socket, to raise the library's backlog of 5
  std::thread http_thread;
  int port = -1;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false;
};

void Server::Impl::install() {
  const int threads = std::max(4, options.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_max_count(1000);
  // The library listens with a backlog of 5 (fixed when it was compiled): a burst of clients
  // connecting at once overflows it and some see their connection fail. Keep its socket options
  // and remember the socket, so start() can listen again with the system's maximum.
  http.set_socket_options([this](socket_t fd) {
    httplib::default_socket_options(fd);
    listen_fd = int(fd);
  });
  if (!options.fault_injection.empty()) {
    http.set_default_headers({{"X-Dsa-Fault-Injection", options.fault_injection}});
  }
  // Statuses set by the library itself (unknown route, body too large, unparsable request) get
  // an OpenAI error body; responses that already carry one are left alone.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = status_message(res.status);
    if (res.status == 404) message = fmt::format("no route {} {}", req.method, req.path);
    send_json(res, res.status, ApiError(res.status, message).body());
  });
  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("serve: 500 on {} {}: {}", req.method, req.path, what);
        send_json(res, 500, ApiError(500, "internal error: " + what).body());
      });
  install_routes(http, *this);
}

Server::Server(ServerOptions options, ModelLoader loader)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(loader))) {}

Server::~Server() { stop(); }

void Server::start() {
  Impl& s = *impl_;
  s.install();
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
  } else {
    s.port = s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  require(s.port > 0, ErrorCode::kIo, "cannot listen on {}:{} (in use, or not an address here)",
          s.options.host, s.options.port);
  if (s.listen_fd >= 0 && ::listen(s.listen_fd, SOMAXCONN) != 0) {
    spdlog::warn("serve: could not raise the listen backlog: {}", std::strerror(errno));
  }
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  if (!s.options.fault_injection.empty()) {
    spdlog::warn(
        "serve: FAULT INJECTION IS ON ({}): this server corrupts sessions on purpose; "
        "every response says so in X-Dsa-Fault-Injection",
        s.options.fault_injection);
  }
  s.loop.start(s.loader);
}

int Server::port() const { return impl_->port; }

std::string Server::wait() {
  Impl& s = *impl_;
  s.loop.wait_loaded();
  const std::string error = s.loop.load_error();
  if (!error.empty()) return error;
  std::unique_lock lock(s.stop_mu);
  s.stop_cv.wait(lock, [&] { return s.stopped; });
  return {};
}

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.stop_mu);
    if (s.stopped) return;
    s.stopped = true;
  }
  s.stopping = true;
  s.loop.stop();  // open requests end with 503, so their HTTP threads finish
  s.http.stop();
  if (s.http_thread.joinable()) s.http_thread.join();
  s.stop_cv.notify_all();
}

ServerSnapshot Server::snapshot() const {
  const Impl& s = *impl_;
  ServerSnapshot snap;
  snap.ready = s.loop.ready();
  snap.load_error = s.loop.load_error();
  const EngineGauges g = s.metrics.gauges();
  snap.total_pages = g.usable_pages + 1;
  snap.free_pages = g.usable_pages - g.used_pages - g.cached_pages;
  snap.cached_pages = g.cached_pages;
  snap.running = g.running;
  snap.waiting = g.waiting;
  snap.in_flight = s.loop.in_flight();
  snap.stats = g.stats;
  return snap;
}

}  // namespace dsa::server
