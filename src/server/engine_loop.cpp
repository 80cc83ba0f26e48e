#include "server/engine_loop.h"

#include <spdlog/spdlog.h>

#include "dsa/error.h"
#include "dsa/text/tokenizer.h"

namespace dsa::server {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// An engine failure as the client sees it. The engine fails a request with kOutOfRange (past the
// context) or kResourceExhausted (the pool cannot hold it even alone): both are the request's
// size, so 400; anything else is a bug or a device fault, so 500.
ApiError engine_error(const RequestOutput& out) {
  const ErrorCode code = out.error.value_or(ErrorCode::kInternal);
  const bool client = code == ErrorCode::kOutOfRange || code == ErrorCode::kResourceExhausted ||
                      code == ErrorCode::kInvalidArgument;
  return ApiError(client ? 400 : 500, out.message, client ? "messages" : "",
                  client ? "context_length_exceeded" : "");
}

}  // namespace

EngineLoop::EngineLoop(Metrics& metrics, int max_queue)
    : metrics_(metrics), max_queue_(max_queue) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start(ModelLoader loader) {
  thread_ = std::thread([this, loader = std::move(loader)]() mutable { run(std::move(loader)); });
}

void EngineLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string EngineLoop::load_error() const {
  std::lock_guard lock(mu_);
  return load_error_;
}

void EngineLoop::wait_loaded() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return loaded_.load() || stop_.load(); });
}

bool EngineLoop::submit(Submission s) {
  if (stop_) return false;
  const int64_t limit = int64_t(info_.max_running) + max_queue_;
  int64_t n = in_flight_.load();
  do {
    if (n >= limit) return false;
  } while (!in_flight_.compare_exchange_weak(n, n + 1));
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(Command{std::move(s), nullptr, CancelReason::kClientGone});
  }
  cv_.notify_all();
  return true;
}

void EngineLoop::cancel(const std::shared_ptr<RequestChannel>& channel, CancelReason reason) {
  {
    std::lock_guard lock(mu_);
    inbox_.push_back(Command{Submission{}, channel, reason});
  }
  cv_.notify_all();
}

void EngineLoop::run(ModelLoader loader) {
  LoadedModel m;
  try {
    m = loader();
    require(m.model && m.cache && m.tokenizer, ErrorCode::kInvalidArgument,
            "the loader gave no model, cache or tokenizer");
    require(m.tokenizer->vocab_size() <= m.model->config().vocab_size, ErrorCode::kInvalidArgument,
            "the tokenizer's {} ids do not fit the model's vocab_size = {}",
            m.tokenizer->vocab_size(), m.model->config().vocab_size);
  } catch (const std::exception& e) {
    spdlog::error("serve: loading the model failed: {}", e.what());
    std::lock_guard lock(mu_);
    load_error_ = e.what();
    loaded_ = true;
    cv_.notify_all();
    return;
  }
  std::unique_ptr<Engine> engine;
  try {
    engine = std::make_unique<Engine>(*m.model, *m.cache, m.engine);
  } catch (const std::exception& e) {
    spdlog::error("serve: starting the engine failed: {}", e.what());
    std::lock_guard lock(mu_);
    load_error_ = e.what();
    loaded_ = true;
    cv_.notify_all();
    return;
  }
  info_.max_context = m.model->max_context();
  info_.vocab_size = m.model->config().vocab_size;
  info_.max_running = engine->options().max_running;
  info_.tokenizer = m.tokenizer;
  publish(*engine, *m.cache);
  {
    std::lock_guard lock(mu_);
    ready_ = true;
    loaded_ = true;
  }
  cv_.notify_all();
  spdlog::info("serve: model loaded ({} max context, {} requests at once, {} cache pages)",
               info_.max_context, info_.max_running, m.cache->allocator().total_pages());

  while (true) {
    std::vector<Command> commands;
    {
      std::unique_lock lock(mu_);
      if (inbox_.empty() && engine->idle() && !stop_) {
        cv_.wait(lock, [&] { return stop_.load() || !inbox_.empty(); });
      }
      if (stop_) break;
      commands.swap(inbox_);
    }
    apply(*engine, commands);
    bool stepped = false;
    if (!engine->idle()) {
      try {
        engine->step();
        stepped = true;
      } catch (const std::exception& e) {
        spdlog::error("serve: engine step failed, failing {} requests: {}", live_.size(), e.what());
        for (auto& [id, live] : live_) {
          try {
            engine->abort(id);
          } catch (const std::exception&) {  // the engine is already broken; the channel closes
          }
        }
        engine->take_finished();
        fail_all(fmt::format("engine step failed: {}", e.what()), 500);
      }
    }
    if (stepped) forward(*engine);
    for (RequestOutput& out : engine->take_finished()) {
      auto it = live_.find(out.id);
      if (it == live_.end()) continue;
      ChannelFinal final{out.reason, out.prompt_tokens, int(out.tokens.size()), std::nullopt,
                         out.cached_tokens};
      if (out.reason == FinishReason::kFailed) final.error = engine_error(out);
      close(it->second, std::move(final));
      live_.erase(it);
    }
    publish(*engine, *m.cache);
  }
  // Stopping: every request still held gets a 503; queued submissions too.
  std::vector<Command> left;
  {
    std::lock_guard lock(mu_);
    left.swap(inbox_);
  }
  for (Command& c : left) {
    if (c.submission.channel) {
      Live l{c.submission.channel, c.submission.arrival, {}, {}, 0, 0, std::nullopt};
      close(l, ChannelFinal{FinishReason::kFailed, 0, 0, ApiError(503, "the server is stopping")});
    }
  }
  fail_all("the server is stopping", 503);
  engine.reset();
}

void EngineLoop::apply(Engine& engine, std::vector<Command>& commands) {
  for (Command& c : commands) {
    if (c.cancel) {
      const int64_t id = c.cancel->engine_id;
      auto it = live_.find(id);
      if (it == live_.end()) continue;  // already finished
      it->second.cancelled = c.reason;
      engine.abort(id);  // releases its pages now; its output comes through take_finished()
      continue;
    }
    Submission& s = c.submission;
    Live live{s.channel, s.arrival, {}, {}, 0, int(s.prompt.size()), std::nullopt};
    try {
      const int64_t id = engine.submit(std::move(s.prompt), s.params);
      s.channel->engine_id = id;
      live_.emplace(id, std::move(live));
    } catch (const Error& e) {  // validated by the HTTP thread already; still never a 500
      close(live, ChannelFinal{FinishReason::kFailed, 0, 0, ApiError(400, e.what())});
    }
  }
}

void EngineLoop::forward(const Engine& engine) {
  const Clock::time_point now = Clock::now();
  for (const NewToken& t : engine.new_tokens()) {
    auto it = live_.find(t.request);
    if (it == live_.end()) continue;
    Live& l = it->second;
    if (l.tokens == 0) {
      l.first_token = now;
      metrics_.time_to_first_token(seconds(now - l.arrival));
    } else {
      metrics_.inter_token_latency(seconds(now - l.last_token));
    }
    l.last_token = now;
    ++l.tokens;
    l.channel->append(t.token);
    to_wake_.push_back(l.channel);
  }
  waker_.post(to_wake_);
}

void EngineLoop::close(Live& l, ChannelFinal final) {
  const Clock::time_point now = Clock::now();
  std::string reason;
  switch (final.reason) {
    case FinishReason::kStop:
      reason = "stop";
      break;
    case FinishReason::kLength:
      reason = "length";
      break;
    case FinishReason::kAborted:
      reason = l.cancelled == CancelReason::kStopString ? "stop" : "abort";
      break;
    case FinishReason::kFailed:
      reason = "error";
      break;
  }
  const double tpot = l.tokens >= 2 ? seconds(l.last_token - l.first_token) / (l.tokens - 1) : 0.0;
  metrics_.request_finished(seconds(now - l.arrival), tpot, l.prompt_tokens, l.tokens, reason);
  l.channel->close(std::move(final));
  --in_flight_;
}

void EngineLoop::fail_all(const std::string& message, int status) {
  for (auto& [id, live] : live_) {
    close(live, ChannelFinal{FinishReason::kFailed, live.prompt_tokens, live.tokens,
                             ApiError(status, message)});
  }
  live_.clear();
}

void EngineLoop::publish(const Engine& engine, KvCache& cache) {
  EngineGauges g;
  g.running = int64_t(engine.running());
  g.waiting = int64_t(engine.waiting());
  g.used_pages = cache.allocator().used_pages();
  g.cached_pages = cache.allocator().cached_pages();
  g.usable_pages = cache.allocator().total_pages() - 1;
  g.stats = engine.stats();
  metrics_.publish(g);
}

}  // namespace dsa::server
