// One request's stream from the engine thread to the HTTP thread that serves it. The engine thread
// appends tokens after every step and finally closes the channel with the outcome; the HTTP thread
// blocks until something new arrives. The lock is held only to move a few integers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dsa/engine.h"
#include "server/api_error.h"

namespace dsa::server {

struct ChannelFinal {
  FinishReason reason = FinishReason::kLength;
  int prompt_tokens = 0;
  int generated_tokens = 0;       // all the engine generated (may exceed what was streamed)
  std::optional<ApiError> error;  // set when the request failed
  int cached_tokens = 0;          // prompt tokens found in the prefix cache (not prefilled)
};

class RequestChannel {
 public:
  // Engine thread.
  void push(int32_t token) {
    append(token);
    wake();
  }
  // append() without wake(): the engine thread appends a step's tokens and leaves the waking to a
  // Waker, off its own path.
  void append(int32_t token) {
    std::lock_guard lock(mu_);
    tokens_.push_back(token);
  }
  void wake() { cv_.notify_one(); }
  void close(ChannelFinal final) {
    {
      std::lock_guard lock(mu_);
      final_ = std::move(final);
    }
    cv_.notify_one();
  }

  // HTTP thread: waits until a token or the outcome is there (or the timeout passes), then moves
  // the new tokens into `tokens` (appending) and returns the outcome once it is known.
  std::optional<ChannelFinal> wait(std::vector<int32_t>& tokens,
                                   std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !tokens_.empty() || final_.has_value(); });
    tokens.insert(tokens.end(), tokens_.begin(), tokens_.end());
    tokens_.clear();
    return final_;
  }

  int64_t engine_id = -1;  // engine thread only

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::optional<ChannelFinal> final_;
};

// Wakes the HTTP threads of the channels a step appended to, on a thread of its own. A wake is a
// futex call of a few microseconds (about 6 us each for 60 waiting threads, measured on the
// development machine); done on the engine thread, 60 of them per step would delay every step by
// the time of a small kernel.
class Waker {
 public:
  Waker() : thread_([this] { run(); }) {}
  ~Waker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  void post(std::vector<std::shared_ptr<RequestChannel>>& channels) {
    if (channels.empty()) return;
    {
      std::lock_guard lock(mu_);
      if (pending_.empty()) {
        pending_.swap(channels);
      } else {
        pending_.insert(pending_.end(), channels.begin(), channels.end());
      }
    }
    channels.clear();
    cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::shared_ptr<RequestChannel>> batch;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stopping, nothing left to wake
        batch.swap(pending_);
      }
      for (const auto& channel : batch) channel->wake();
      batch.clear();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestChannel>> pending_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace dsa::server
