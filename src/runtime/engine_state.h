// The engine's private per-request and per-session state, shared by engine.cpp and session.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsa/engine.h"

namespace dsa {

struct Engine::Request {
  int64_t id = -1;
  int64_t session = -1;      // -1: a plain request
  std::vector<int32_t> seq;  // the prompt, then every generated token
  int prompt_len = 0;        // seq[0, prompt_len) is the prompt (a turn: history + new tokens)
  RequestParams params;
  PageTable pages;
  int64_t n_cached = 0;      // seq[0, n_cached) have their KV in the cache
  int64_t prefill_end = 0;   // seq.size() at (re)admission: positions below it are prefill rows
  int64_t admit_order = -1;  // -1 while waiting
  int preemptions = 0;
  int cached_tokens = 0;  // n_cached at first admission
  bool corrupted = false;
  std::vector<AuditFinding> findings;
  std::optional<ErrorCode> error;
  std::string message;

  int generated() const { return int(seq.size()) - prompt_len; }
  bool prefilling() const { return n_cached < prefill_end; }
};

struct Engine::Session {
  SessionState state;
  PageTable pages;        // the kept history cache between turns (kKeepCache), else empty
  int64_t n_cached = 0;   // history tokens whose KV is in `pages`
  int64_t last_used = 0;  // engine step of the last turn's end, for least-recently-used eviction
};

}  // namespace dsa
