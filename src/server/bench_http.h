// The bench client's one HTTP exchange: POST a body, read the SSE stream as it arrives, and time
// it (first generated text, gaps between chunks, the end).
#pragma once

#include <chrono>
#include <string>

#include "dsa/bench_serve.h"

namespace dsa::bench {

struct Endpoint {
  std::string host;
  int port = 80;
  std::string base;  // e.g. "http://127.0.0.1:8000"
};
// "http://HOST:PORT" (a trailing slash is fine); kInvalidArgument otherwise.
Endpoint parse_url(const std::string& url);

using BenchClock = std::chrono::steady_clock;

// Sends one streaming request (completions or chat, told apart by the chunks) and fills the
// record's timing, tokens, reply and status. Never throws: failures land in record.error.
void stream_request(const Endpoint& endpoint, const std::string& path, const std::string& api_key,
                    int timeout_s, BenchClock::time_point bench_start, RequestRecord& record);

// GET returning the body and status (0 when the server cannot be reached).
std::pair<int, std::string> http_get(const Endpoint& endpoint, const std::string& path,
                                     const std::string& api_key);

}  // namespace dsa::bench
