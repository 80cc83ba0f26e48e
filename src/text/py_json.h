// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": "
// separators, keys in insertion order, non-ASCII characters kept as they are, floats in their
// shortest round-trip form with Python's repr layout (1.0, 1e-05, 1e+16). DeepSeek's prompt
// encoder renders tool schemas and argument values this way, so the prompt bytes depend on it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsa::text {

// Appends json.dumps(value, ensure_ascii=False) to out.
void append_py_json(std::string& out, const nlohmann::ordered_json& value);
std::string py_json(const nlohmann::ordered_json& value);

// Appends the body of a JSON string literal (no quotes) the way json.dumps escapes it: \" \\ \b
// \f \n \r \t, other bytes below 0x20 as \u00XX, everything else byte for byte.
void append_py_json_escaped(std::string& out, std::string_view text);

// Python's repr() of a finite double, e.g. 2.5, 100.0, 1e-05, 1.2345678901234568e+17.
std::string py_float_repr(double v);

}  // namespace dsa::text
