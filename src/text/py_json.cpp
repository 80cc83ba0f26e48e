#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace dsa::text {

void append_py_json_escaped(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xF];
          out += kHex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits in scientific form, e.g. "-1.2345e-05", then Python's layout:
  // positional when -4 <= exponent < 16, scientific otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view sci(buf, size_t(res.ptr - buf));
  const size_t e_pos = sci.find('e');
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  std::string sign, digits;
  for (const char c : sci.substr(0, e_pos)) {
    if (c == '-')
      sign = "-";
    else if (c != '.')
      digits += c;
  }
  std::string out = sign;
  if (exp10 >= -4 && exp10 < 16) {
    const int point = exp10 + 1;  // digits before the decimal point
    if (point <= 0) {
      out += "0." + std::string(size_t(-point), '0') + digits;
    } else if (size_t(point) >= digits.size()) {
      out += digits + std::string(size_t(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp10 < 0 ? "e-" : "e+";
  const int a = std::abs(exp10);
  if (a < 10) out += '0';
  out += std::to_string(a);
  return out;
}

void append_py_json(std::string& out, const nlohmann::ordered_json& value) {
  using V = nlohmann::ordered_json::value_t;
  switch (value.type()) {
    case V::null:
      out += "null";
      break;
    case V::boolean:
      out += value.get<bool>() ? "true" : "false";
      break;
    case V::number_integer:
      out += std::to_string(value.get<int64_t>());
      break;
    case V::number_unsigned:
      out += std::to_string(value.get<uint64_t>());
      break;
    case V::number_float:
      out += py_float_repr(value.get<double>());
      break;
    case V::string:
      out += '"';
      append_py_json_escaped(out, value.get_ref<const std::string&>());
      out += '"';
      break;
    case V::array: {
      out += '[';
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        append_py_json(out, item);
      }
      out += ']';
      break;
    }
    case V::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        out += '"';
        append_py_json_escaped(out, key);
        out += "\": ";
        append_py_json(out, item);
      }
      out += '}';
      break;
    }
    case V::binary:
    case V::discarded:
      out += "null";
      break;
  }
}

std::string py_json(const nlohmann::ordered_json& value) {
  std::string out;
  append_py_json(out, value);
  return out;
}

}  // namespace dsa::text
