// Errors of dsa.cpp. Every message names the offending value and the limit it broke, and carries
// the file:line of the check that raised it.
#pragma once

#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dsa {

enum class ErrorCode {
  kInvalidArgument,    // bad config, flag, shape or request
  kOutOfRange,         // a value past its limit: prompt over context, slot past capacity
  kResourceExhausted,  // a pool or allocator ran out; the caller may preempt and retry
  kIo,                 // an input file missing, not a regular file, truncated or malformed
  kWriteFailed,        // an output file could not be written completely (ENOSPC, EIO, ...)
  kBackend,            // a device call failed
  kInternal,           // a broken invariant: a bug in dsa.cpp
};

std::string_view error_code_name(ErrorCode code);

// The dsa program's exit statuses. 0 and kExitCorruption are verdicts; the others say why a run
// could not finish. `dsa --help` and the README's Commands section print this table.
inline constexpr int kExitCorruption = 1;  // a check ran and found corruption
inline constexpr int kExitBadInput = 2;    // a flag, file, config or checkpoint was refused
inline constexpr int kExitRuntime = 3;     // the device failed, or memory ran out mid-run
inline constexpr int kExitWrite = 4;       // an output (file or stdout) could not be written
inline constexpr int kExitInternal = 5;    // a broken invariant: a bug in dsa.cpp
int exit_status(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

[[noreturn]] void throw_error(ErrorCode code, std::string message, std::source_location loc);

// A format string that remembers where it was written; fmt checks it at compile time.
// (CUDA translation units do not include this header: nvcc cannot evaluate fmt's checks. CUDA
// launchers return cudaError_t, and the host-side backend turns that into an Error.)
#if defined(__CUDACC__)
#error "dsa/error.h is host-only; return cudaError_t from .cu code instead"
#endif
template <typename... Args>
struct LocatedFormat {
  template <typename S>
  consteval LocatedFormat(const S& s, std::source_location l = std::source_location::current())
      : format(s), loc(l) {}
  fmt::format_string<Args...> format;
  std::source_location loc;
};

// fail(ErrorCode::kInvalidArgument, "unknown preset '{}'", name): always throws dsa::Error.
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, LocatedFormat<std::type_identity_t<Args>...> f,
                       Args&&... args) {
  throw_error(code, fmt::format(f.format, std::forward<Args>(args)...), f.loc);
}

// require(n <= max, ErrorCode::kOutOfRange, "prompt has {} tokens, context holds {}", n, max):
// throws dsa::Error when the condition is false. The message is formatted only on failure.
template <typename... Args>
void require(bool ok, ErrorCode code, LocatedFormat<std::type_identity_t<Args>...> f,
             Args&&... args) {
  if (!ok) throw_error(code, fmt::format(f.format, std::forward<Args>(args)...), f.loc);
}

}  // namespace dsa
