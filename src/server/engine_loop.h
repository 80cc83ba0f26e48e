// The engine thread: it loads the model, then owns the model, the cache and the engine. HTTP
// threads hand it requests and cancellations through a small locked inbox; it steps the engine
// with no lock held, then forwards each step's new tokens and finished requests to the requests'
// channels and records the latency metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dsa/server.h"
#include "server/channel.h"
#include "server/metrics.h"

namespace dsa::server {

using Clock = std::chrono::steady_clock;

// Why a request is cancelled, for the finish-reason metric: a stop string matched on the text
// counts as "stop", a client gone as "abort".
enum class CancelReason : uint8_t { kStopString, kClientGone };

struct Submission {
  std::vector<int32_t> prompt;
  RequestParams params;
  std::shared_ptr<RequestChannel> channel;
  Clock::time_point arrival;
};

// What HTTP threads may read once the model is loaded (it never changes after).
struct ModelInfo {
  int max_context = 0;
  int vocab_size = 0;
  int max_running = 0;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

class EngineLoop {
 public:
  EngineLoop(Metrics& metrics, int max_queue);
  ~EngineLoop();  // stop()

  void start(ModelLoader loader);
  void stop();

  bool ready() const { return ready_.load(); }
  std::string load_error() const;
  const ModelInfo& info() const { return info_; }  // only once ready()

  // Hands a request to the engine thread. False when running + queued would exceed
  // max_running + max_queue (the caller answers 429).
  bool submit(Submission s);
  void cancel(const std::shared_ptr<RequestChannel>& channel, CancelReason reason);

  int64_t in_flight() const { return in_flight_.load(); }
  // Waits until load finishes (ready or failed) or stop().
  void wait_loaded();

 private:
  struct Command {
    Submission submission;  // channel set: a submission
    std::shared_ptr<RequestChannel> cancel;
    CancelReason reason = CancelReason::kClientGone;
  };
  struct Live {
    std::shared_ptr<RequestChannel> channel;
    Clock::time_point arrival, first_token, last_token;
    int tokens = 0;
    int prompt_tokens = 0;
    std::optional<CancelReason> cancelled;
  };

  void run(ModelLoader loader);
  void apply(Engine& engine, std::vector<Command>& commands);
  void forward(const Engine& engine);
  void close(Live& live, ChannelFinal final);
  void fail_all(const std::string& message, int status);
  void publish(const Engine& engine, KvCache& cache);

  Metrics& metrics_;
  int max_queue_;
  ModelInfo info_;
  std::atomic<bool> ready_{false}, stop_{false}, loaded_{false};
  std::atomic<int64_t> in_flight_{0};
  mutable std::mutex mu_;  // guards inbox_ and load_error_
  std::condition_variable cv_;
  std::vector<Command> inbox_;
  std::string load_error_;
  std::unordered_map<int64_t, Live> live_;  // by engine request id; engine thread only
  std::vector<std::shared_ptr<RequestChannel>> to_wake_;  // engine thread only
  Waker waker_;  // outlives the engine thread, which posts to it
  std::thread thread_;
};

}  // namespace dsa::server
