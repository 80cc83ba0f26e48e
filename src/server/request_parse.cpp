#include "server/request_parse.h"

#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace dsa::server {
namespace {

using nlohmann::json;

const char* type_name(const json& v) { return v.type_name(); }

// A present, non-null field.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> integer(const json& obj, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    throw bad_request(name, "must be an integer, got {} {}", type_name(*v), v->dump());
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(hi)) {
    throw bad_request(name, "must be at most {}, got {}", hi, v->get<uint64_t>());
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) throw bad_request(name, "must be in [{}, {}], got {}", lo, hi, x);
  return x;
}

std::optional<double> number(const json& obj, const char* name, double lo, double hi) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(name, "must be a number, got {}", type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    throw bad_request(name, "must be in [{}, {}], got {}", lo, hi, x);
  }
  return x;
}

std::optional<bool> boolean(const json& obj, const char* name) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(name, "must be a boolean, got {}", type_name(*v));
  return v->get<bool>();
}

// A string field; `path` names it in errors (default: the key).
std::optional<std::string> string(const json& obj, const char* key, const std::string& path = {}) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    throw bad_request(path.empty() ? key : path, "must be a string, got {}", type_name(*v));
  }
  return v->get<std::string>();
}

constexpr int64_t kMaxTokensLimit = int64_t(1) << 30;

GenerationRequest parse_generation(const json& body) {
  GenerationRequest g;
  g.max_tokens = integer(body, "max_completion_tokens", 1, kMaxTokensLimit);
  if (!g.max_tokens)
    g.max_tokens = integer(body, "max_tokens", 1, kMaxTokensLimit);
  else
    integer(body, "max_tokens", 1, kMaxTokensLimit);  // still type-checked
  g.sampling.temperature = float(number(body, "temperature", 0.0, 2.0).value_or(1.0));
  const std::optional<double> top_p = number(body, "top_p", 0.0, 1.0);
  if (top_p && *top_p <= 0.0) throw bad_request("top_p", "must be in (0, 1], got {}", *top_p);
  g.sampling.top_p = float(top_p.value_or(1.0));
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer()) {
      throw bad_request("seed", "must be an integer, got {} {}", type_name(*seed), seed->dump());
    }
    g.sampling.seed =
        seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
    g.seeded = true;
  }
  if (const std::optional<int64_t> n = integer(body, "n", 1, kMaxTokensLimit); n && *n != 1) {
    throw bad_request("n", "must be 1 (one choice per request), got {}", *n);
  }
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      g.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) throw bad_request("stop", "has {} strings, at most 4", stop->size());
      for (const json& s : *stop) {
        if (!s.is_string()) throw bad_request("stop", "must hold strings, got {}", type_name(s));
        g.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad_request("stop", "must be a string or an array of strings, got {}",
                        type_name(*stop));
    }
    for (const std::string& s : g.stop) {
      if (s.empty()) throw bad_request("stop", "must not hold an empty string");
    }
  }
  g.stream = boolean(body, "stream").value_or(false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) {
      throw bad_request("stream_options", "must be an object, got {}", type_name(*options));
    }
    if (!g.stream) throw bad_request("stream_options", "is only allowed with stream: true");
    g.include_usage = boolean(*options, "include_usage").value_or(false);
  }
  g.return_token_ids = boolean(body, "return_token_ids").value_or(false);
  g.ignore_eos = boolean(body, "ignore_eos").value_or(false);
  return g;
}

}  // namespace

json parse_body(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    // Parse again for the reason (position and cause); the fast path above does not throw.
    try {
      j = json::parse(body);
    } catch (const json::exception& e) {
      throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
    }
  }
  if (!j.is_object()) {
    throw ApiError(400, fmt::format("the body must be a JSON object, got {}", type_name(j)));
  }
  return j;
}

void check_model(const json& body, const std::string& served_model) {
  const std::optional<std::string> model = string(body, "model");
  if (model && *model != served_model) {
    throw ApiError(
        404,
        fmt::format("the model '{}' does not exist; this server serves '{}'", *model, served_model),
        "model", "model_not_found");
  }
}

CompletionRequest parse_completion_request(const json& body) {
  CompletionRequest r;
  r.gen = parse_generation(body);
  const json* prompt = field(body, "prompt");
  if (!prompt) throw bad_request("prompt", "is required");
  const json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];  // a batch of one
  }
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    if (r.prompt_text->empty()) throw bad_request("prompt", "must not be empty");
    return r;
  }
  if (!p->is_array()) {
    throw bad_request("prompt", "must be a string or an array of token ids, got {}", type_name(*p));
  }
  if (p->empty()) throw bad_request("prompt", "must not be empty");
  for (size_t i = 0; i < p->size(); ++i) {
    const json& t = (*p)[i];
    if (t.is_string() || t.is_array()) {
      throw bad_request("prompt", "holds {} prompts; one prompt per request is served", p->size());
    }
    if (!t.is_number_integer()) {
      throw bad_request("prompt", "token {} must be an integer id, got {}", i, type_name(t));
    }
    if (t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX)) {
      throw bad_request("prompt", "token {} is {}, past any vocabulary", i, t.get<uint64_t>());
    }
    r.prompt_ids.push_back(t.get<int64_t>());
  }
  return r;
}

ChatRequest parse_chat_request(const json& body) {
  ChatRequest r;
  r.gen = parse_generation(body);
  if (!field(body, "messages")) throw bad_request("messages", "is required");
  const json* tools = field(body, "tools");
  const bool has_tools = tools && tools->is_array() && !tools->empty();
  if (const json* choice = field(body, "tool_choice")) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "auto")
        r.tool_choice = ToolChoice::kAuto;
      else if (c == "none")
        r.tool_choice = ToolChoice::kNone;
      else if (c == "required")
        r.tool_choice = ToolChoice::kRequired;
      else
        throw bad_request("tool_choice", "must be auto, none, required or a function, got \"{}\"",
                          c);
    } else if (choice->is_object()) {
      const json* f = field(*choice, "function");
      const std::optional<std::string> name =
          f && f->is_object() ? string(*f, "name", "tool_choice.function.name") : std::nullopt;
      if (string(*choice, "type", "tool_choice.type").value_or("") != "function" || !name) {
        throw bad_request("tool_choice",
                          "must name a function as {{\"type\": \"function\", \"function\": "
                          "{{\"name\": ...}}}}");
      }
      bool known = false;
      if (has_tools) {
        for (const json& t : *tools) {
          known |= t.is_object() && t.contains("function") && t["function"].is_object() &&
                   t["function"].value("name", json()) == *name;
        }
      }
      if (!known)
        throw bad_request("tool_choice", "names the function \"{}\", not in tools", *name);
      r.tool_choice = ToolChoice::kNamed;
      r.tool_choice_name = *name;
    } else {
      throw bad_request("tool_choice", "must be a string or an object, got {}", type_name(*choice));
    }
    if (r.tool_choice == ToolChoice::kRequired && !has_tools) {
      throw bad_request("tool_choice", "is \"required\" but no tools are given");
    }
  }
  r.parallel_tool_calls = boolean(body, "parallel_tool_calls").value_or(true);
  return r;
}

}  // namespace dsa::server
