// Ids unique within one server process: a random per-process tag plus a counter, so two requests
// (or two tool calls) never share an id, however close in time they come.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>

namespace dsa::server {

class IdSource {
 public:
  IdSource() : tag_(std::random_device{}() & 0xffffffu) {}
  // "<prefix><6 hex tag><counter as 10 hex digits>", e.g. chatcmpl-3fa9c20000000001.
  std::string next(const char* prefix) {
    return fmt::format("{}{:06x}{:010x}", prefix, tag_, counter_.fetch_add(1) + 1);
  }

 private:
  uint32_t tag_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace dsa::server
