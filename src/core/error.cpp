#include "dsa/error.h"

namespace dsa {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kIo: return "i/o";
    case ErrorCode::kBackend: return "backend";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

void throw_error(ErrorCode code, std::string message, std::source_location loc) {
  std::string file = loc.file_name();
  if (auto pos = file.rfind("/src/"); pos != std::string::npos) file = file.substr(pos + 1);
  throw Error(code, fmt::format("{} ({}: {}:{})", message, error_code_name(code), file, loc.line()));
}

}  // namespace dsa
