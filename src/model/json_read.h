// Reading JSON that came from a file: nesting bounded before parsing, and field values checked
// by type and range, every error naming the field, the value given and what was expected (never
// the JSON library's own text).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dsa/error.h"

namespace dsa {

// The deepest nesting of arrays and objects in `text` (strings skipped), counting up to `stop_at`.
int json_nesting_depth(std::string_view text, int stop_at);

// Parses `text`, refusing first any nesting deeper than max_depth (a deep nest would exhaust the
// stack of a recursive reader). Errors are `code`, naming `what` (the file).
nlohmann::json parse_json_bounded(std::string_view text, int max_depth, std::string_view what,
                                  ErrorCode code);

// `s` with control bytes (NUL included) written as \xNN, for messages.
std::string printable(std::string_view s);

// The value as a short string for messages: at most 60 characters of its JSON text.
std::string json_excerpt(const nlohmann::json& v);

// An integer in [lo, hi]; refuses fractions (256.75), booleans, strings and values outside the
// range (4294967552, -4294967040), naming `field`.
int64_t json_int(const nlohmann::json& v, std::string_view field, int64_t lo, int64_t hi,
                 ErrorCode code = ErrorCode::kInvalidArgument);
// A finite number (integer or not) in [lo, hi].
double json_number(const nlohmann::json& v, std::string_view field, double lo, double hi,
                   ErrorCode code = ErrorCode::kInvalidArgument);
bool json_bool(const nlohmann::json& v, std::string_view field,
               ErrorCode code = ErrorCode::kInvalidArgument);
std::string json_string(const nlohmann::json& v, std::string_view field,
                        ErrorCode code = ErrorCode::kInvalidArgument);

}  // namespace dsa
