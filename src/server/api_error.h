// OpenAI-style API errors: an HTTP status plus the body
// {"error": {"message", "type", "param", "code"}}. Every rejection of bad input is one of these,
// with a 4xx status and a message naming the field and its limit; a 500 is a bug.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace dsa::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(message),
        status_(status),
        param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // OpenAI's error type for the status: invalid_request_error, authentication_error, ...
  std::string type() const;
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_, code_;
};

// A 400 naming the field: bad_request("max_tokens", "must be >= 1, got {}", v).
template <typename... Args>
ApiError bad_request(std::string param, fmt::format_string<Args...> f, Args&&... args) {
  std::string message = fmt::format(f, std::forward<Args>(args)...);
  if (!param.empty()) message = fmt::format("'{}' {}", param, message);
  return ApiError(400, std::move(message), std::move(param));
}

std::string error_type_for_status(int status);

// JSON text safe for any bytes: invalid UTF-8 in strings becomes U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);

}  // namespace dsa::server
