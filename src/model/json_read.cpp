#include "model/json_read.h"

#include <cmath>
#include <limits>

namespace dsa {

int json_nesting_depth(std::string_view text, int stop_at) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest >= stop_at) return deepest;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

nlohmann::json parse_json_bounded(std::string_view text, int max_depth, std::string_view what,
                                  ErrorCode code) {
  const int depth = json_nesting_depth(text, max_depth + 1);
  require(depth <= max_depth, code,
          "{}: the JSON nests more than {} levels deep; at most {} are allowed", what, max_depth,
          max_depth);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the 1-based offset of the first byte the parser could not take.
    fail(code, "{}: not valid JSON (syntax error at byte {} of {})", what, e.byte, text.size());
  } catch (const nlohmann::json::exception&) {  // out_of_range 406: a number past a double
    fail(code, "{}: not valid JSON (a number is out of the range of a double)", what);
  }
}

std::string printable(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out;
}

std::string json_excerpt(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

int64_t json_int(const nlohmann::json& v, std::string_view field, int64_t lo, int64_t hi,
                 ErrorCode code) {
  require(v.is_number_integer(), code, "{} = {} must be an integer in [{}, {}], not a {}", field,
          json_excerpt(v), lo, hi, v.is_number() ? "fraction" : v.type_name());
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())
                        : true;
  const int64_t x = fits ? v.get<int64_t>() : std::numeric_limits<int64_t>::max();
  require(fits && x >= lo && x <= hi, code, "{} = {} is out of range: must be in [{}, {}]", field,
          json_excerpt(v), lo, hi);
  return x;
}

double json_number(const nlohmann::json& v, std::string_view field, double lo, double hi,
                   ErrorCode code) {
  require(v.is_number(), code, "{} = {} must be a number in [{}, {}], not a {}", field,
          json_excerpt(v), lo, hi, v.type_name());
  const double x = v.get<double>();
  require(std::isfinite(x) && x >= lo && x <= hi, code,
          "{} = {} is out of range: must be in [{}, {}]", field, json_excerpt(v), lo, hi);
  return x;
}

bool json_bool(const nlohmann::json& v, std::string_view field, ErrorCode code) {
  require(v.is_boolean(), code, "{} = {} must be true or false, not a {}", field, json_excerpt(v),
          v.type_name());
  return v.get<bool>();
}

std::string json_string(const nlohmann::json& v, std::string_view field, ErrorCode code) {
  require(v.is_string(), code, "{} = {} must be a string, not a {}", field, json_excerpt(v),
          v.type_name());
  return v.get<std::string>();
}

}  // namespace dsa
