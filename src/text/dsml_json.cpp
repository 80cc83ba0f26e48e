// Strict JSON check for string="false" parameter values: nlohmann's parser (which already refuses
// NaN, Infinity and trailing text in strict mode) plus a duplicate-key check at every depth.
#include <string>
#include <unordered_set>
#include <vector>

#include "dsa/text/tool_calls.h"

namespace dsa::text {
namespace {

class StrictJsonSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override { return keys_.back().insert(k).second; }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  std::vector<std::unordered_set<std::string>> keys_;  // one set per open object
};

}  // namespace

bool is_strict_json_value(std::string_view text) {
  StrictJsonSax sax;
  try {
    return nlohmann::json::sax_parse(text.begin(), text.end(), &sax,
                                     nlohmann::json::input_format_t::json, /*strict=*/true);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace dsa::text
