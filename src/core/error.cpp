#include "dsa/error.h"

namespace dsa {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kOutOfRange:
      return "out of range";
    case ErrorCode::kResourceExhausted:
      return "resource exhausted";
    case ErrorCode::kIo:
      return "i/o";
    case ErrorCode::kWriteFailed:
      return "write failed";
    case ErrorCode::kBackend:
      return "backend";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

int exit_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kResourceExhausted:  // a pool or size the user chose cannot hold the work
    case ErrorCode::kIo:
      return kExitBadInput;
    case ErrorCode::kWriteFailed:
      return kExitWrite;
    case ErrorCode::kBackend:
      return kExitRuntime;
    case ErrorCode::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

void throw_error(ErrorCode code, std::string message, std::source_location loc) {
  std::string file = loc.file_name();
  if (auto pos = file.rfind("/src/"); pos != std::string::npos) file = file.substr(pos + 1);
  throw Error(code,
              fmt::format("{} ({}: {}:{})", message, error_code_name(code), file, loc.line()));
}

}  // namespace dsa
