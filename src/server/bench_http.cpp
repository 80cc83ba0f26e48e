#include "server/bench_http.h"

#include <httplib.h>

#include <map>

#include "dsa/error.h"

namespace dsa::bench {

using nlohmann::json;

Endpoint parse_url(const std::string& url) {
  const std::string scheme = "http://";
  require(url.rfind(scheme, 0) == 0, ErrorCode::kInvalidArgument,
          "--url must look like http://HOST:PORT, got '{}' (https is not spoken)", url);
  std::string rest = url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  require(!rest.empty() && rest.find('/') == std::string::npos, ErrorCode::kInvalidArgument,
          "--url must be http://HOST:PORT without a path, got '{}'", url);
  Endpoint e;
  const size_t colon = rest.rfind(':');
  e.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    require(!port.empty() && port.size() <= 5 &&
                port.find_first_not_of("0123456789") == std::string::npos,
            ErrorCode::kInvalidArgument, "--url port must be a number, got '{}'", port);
    e.port = std::stoi(port);
    require(e.port >= 1 && e.port <= 65535, ErrorCode::kInvalidArgument,
            "--url port must be in [1, 65535], got {}", e.port);
  }
  require(!e.host.empty(), ErrorCode::kInvalidArgument, "--url has no host: '{}'", url);
  e.base = scheme + rest;
  return e;
}

namespace {

double since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// The streamed reply, accumulated; the canonical form leaves out the per-process ids.
struct Reply {
  std::string content, reasoning;
  struct Call {
    std::string id, name, arguments;
  };
  std::map<int, Call> calls;
  bool chat = false;

  // Takes one chunk; true when it carried generated text.
  bool add(const json& chunk) {
    const auto choices = chunk.find("choices");
    if (choices == chunk.end() || !choices->is_array() || choices->empty()) return false;
    const json& c = (*choices)[0];
    bool generated = false;
    if (c.contains("text") && c["text"].is_string()) {
      const std::string t = c["text"];
      content += t;
      generated = !t.empty();
    }
    if (c.contains("delta") && c["delta"].is_object()) {
      chat = true;
      const json& d = c["delta"];
      if (d.contains("content") && d["content"].is_string()) {
        content += d["content"].get<std::string>();
        generated |= !d["content"].get<std::string>().empty();
      }
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
        reasoning += d["reasoning_content"].get<std::string>();
        generated |= !d["reasoning_content"].get<std::string>().empty();
      }
      if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
        for (const json& t : d["tool_calls"]) {
          Call& call = calls[t.value("index", 0)];
          if (t.contains("id") && t["id"].is_string()) call.id = t["id"];
          if (t.contains("function") && t["function"].is_object()) {
            const json& f = t["function"];
            if (f.contains("name") && f["name"].is_string()) call.name += f["name"];
            if (f.contains("arguments") && f["arguments"].is_string()) {
              call.arguments += f["arguments"].get<std::string>();
            }
          }
          generated = true;
        }
      }
    }
    return generated;
  }

  std::string canonical() const {
    json calls_json = json::array();
    for (const auto& [index, c] : calls) calls_json.push_back({c.name, c.arguments});
    return json{{"content", content}, {"reasoning", reasoning}, {"tool_calls", calls_json}}.dump(
        -1, ' ', false, json::error_handler_t::replace);
  }

  json message() const {
    json m = {{"role", "assistant"}, {"content", content}};
    if (!calls.empty()) {
      json list = json::array();
      for (const auto& [index, c] : calls) {
        list.push_back({{"id", c.id},
                        {"type", "function"},
                        {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      m["tool_calls"] = std::move(list);
      if (content.empty()) m["content"] = nullptr;
    }
    return m;
  }
};

}  // namespace

void stream_request(const Endpoint& endpoint, const std::string& path, const std::string& api_key,
                    int timeout_s, BenchClock::time_point bench_start, RequestRecord& record) {
  httplib::Client client(endpoint.host, endpoint.port);
  client.set_connection_timeout(10);
  client.set_read_timeout(timeout_s);
  client.set_write_timeout(timeout_s);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = record.body;
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);

  Reply reply;
  std::string buffer, raw;
  bool done = false, first = true;
  double last = 0;
  const BenchClock::time_point start = BenchClock::now();
  record.start_s = std::chrono::duration<double>(start - bench_start).count();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    raw.append(data, n);
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("error")) {
        record.error = chunk["error"].value("message", "error event in the stream");
        continue;
      }
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        record.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
        record.output_tokens = chunk["usage"].value("completion_tokens", 0);
        const json& usage = chunk["usage"];
        if (usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object())
          record.cached_tokens = usage["prompt_tokens_details"].value("cached_tokens", 0);
      }
      if (reply.add(chunk)) {
        const double now = since(start);
        if (first) {
          record.ttft_s = now;
          first = false;
        } else {
          record.itl_s.push_back(now - last);
        }
        last = now;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  record.e2el_s = since(start);
  record.status = sent ? res.status : 0;
  if (sent && res.has_header("X-Dsa-Fault-Injection")) {
    record.fault_injection = res.get_header_value("X-Dsa-Fault-Injection");
  }
  if (!sent) {
    record.error = "no response: " + httplib::to_string(error);
  } else if (res.status != 200) {
    const json body = json::parse(raw, nullptr, false);
    record.error = fmt::format(
        "HTTP {}: {}", res.status,
        !body.is_discarded() && body.contains("error") ? body["error"].value("message", raw) : raw);
  } else if (!done && record.error.empty()) {
    record.error = "the stream ended without [DONE]";
  }
  record.ok = record.error.empty();
  record.reply = reply.canonical();
  record.message = reply.message();
}

std::pair<int, std::string> http_get(const Endpoint& endpoint, const std::string& path,
                                     const std::string& api_key) {
  httplib::Client client(endpoint.host, endpoint.port);
  client.set_connection_timeout(10);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto res = client.Get(path.c_str(), headers);
  if (!res) return {0, httplib::to_string(res.error())};
  return {res->status, res->body};
}

}  // namespace dsa::bench
