// The server's Prometheus metrics, written by hand in the text exposition format (version 0.0.4).
// Names carry the "dsa:" prefix and follow vLLM's where one exists. Histograms are recorded by the
// engine thread; render() is called by HTTP threads. One mutex guards everything: recording is a
// few additions per token, never held across a model step.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dsa/engine.h"

namespace dsa::server {

// A cumulative histogram with fixed upper bounds (seconds), rendered as _bucket/_sum/_count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  void render(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, not cumulative; the last entry is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the engine thread publishes after every step.
struct EngineGauges {
  int64_t running = 0, waiting = 0;
  // usable: total - 1 (page 0 is reserved); used: owned by requests; cached: held only by the
  // prefix cache (evictable). usable = free + used + cached.
  int64_t used_pages = 0, cached_pages = 0, usable_pages = 0;
  EngineStats stats;
};

class Metrics {
 public:
  Metrics();
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  // A finished request: its end-to-end latency, time per output token (when it has >= 2 tokens),
  // token counts and finish reason (stop, length, abort, error).
  void request_finished(double e2e_seconds, double tpot_seconds, int prompt_tokens,
                        int generated_tokens, const std::string& reason);
  void publish(const EngineGauges& gauges);
  EngineGauges gauges() const;
  std::string render() const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_, itl_, e2e_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;
  EngineGauges gauges_;
};

}  // namespace dsa::server
