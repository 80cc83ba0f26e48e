#include "server/api_error.h"

namespace dsa::server {

std::string error_type_for_status(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

std::string ApiError::type() const { return error_type_for_status(status_); }

nlohmann::json ApiError::body() const {
  nlohmann::json e = {{"message", what()},
                      {"type", type()},
                      {"param", param_.empty() ? nlohmann::json() : nlohmann::json(param_)},
                      {"code", code_.empty() ? nlohmann::json(status_) : nlohmann::json(code_)}};
  return {{"error", std::move(e)}};
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dsa::server
