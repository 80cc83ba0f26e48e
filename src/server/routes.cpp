#include "server/routes.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "dsa/error.h"
#include "dsa/text/tokenizer.h"
#include "server/api_error.h"
#include "server/chat.h"
#include "server/generation.h"
#include "server/request_parse.h"

namespace dsa::server {

using httplib::Request;
using httplib::Response;
using nlohmann::json;

namespace {

constexpr std::chrono::milliseconds kWaitSlice{100};

void send_json(Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(Response& res, const ApiError& e) {
  if (e.status() == 429 || e.status() == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status(), e.body());
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Runs a handler body, turning every failure into an OpenAI error: ApiError as it says,
// dsa::Error from bad input as 400, anything else as a logged 500.
template <typename Fn>
void guarded(const Request& req, Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    if (e.status() == 500) spdlog::error("serve: 500 on {} {}: {}", req.method, req.path, e.what());
    send_error(res, e);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kOutOfRange) {
      send_error(res, ApiError(400, e.what()));
    } else {
      spdlog::error("serve: 500 on {} {}: {}", req.method, req.path, e.what());
      send_error(res, ApiError(500, e.what()));
    }
  } catch (const std::exception& e) {
    spdlog::error("serve: 500 on {} {}: {}", req.method, req.path, e.what());
    send_error(res, ApiError(500, fmt::format("internal error: {}", e.what())));
  }
}

void check_auth(const RouteContext& ctx, const Request& req) {
  if (ctx.options.api_key.empty()) return;
  const std::string header = req.get_header_value("Authorization");
  if (header.empty()) {
    throw ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", "",
                   "invalid_api_key");
  }
  if (header != "Bearer " + ctx.options.api_key) {
    throw ApiError(401, "incorrect API key", "", "invalid_api_key");
  }
}

const ModelInfo& ready_model(const RouteContext& ctx) {
  if (ctx.stopping) throw ApiError(503, "the server is stopping");
  if (!ctx.loop.ready()) {
    const std::string error = ctx.loop.load_error();
    throw ApiError(503, error.empty() ? "Loading model" : "the model failed to load: " + error);
  }
  return ctx.loop.info();
}

std::vector<int32_t> checked_ids(const std::vector<int64_t>& ids, int vocab, const char* param) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw bad_request(param, "token {} is {}, outside the vocabulary [0, {})", i, ids[i], vocab);
    }
    out.push_back(int32_t(ids[i]));
  }
  return out;
}

std::vector<int32_t> encode_text(const text::Tokenizer& tok, const std::string& text, bool bos) {
  std::vector<int32_t> ids;
  if (bos && tok.bos_id()) ids.push_back(*tok.bos_id());
  const std::vector<int32_t> body = tok.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

// What differs between completions and chat in a response.
struct ResponseShape {
  std::string id;
  const char* object;        // "text_completion" or "chat.completion"
  const char* chunk_object;  // "text_completion" or "chat.completion.chunk"
  std::string model;
  int64_t created;
  bool chat;
};

json choice_chunk(const ResponseShape& shape, const json& delta, const json& finish_reason) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (shape.chat) {
    choice["delta"] = delta;
  } else {
    choice["text"] = delta.is_object() && delta.contains("text") ? delta["text"] : json("");
  }
  return {{"id", shape.id},
          {"object", shape.chunk_object},
          {"created", shape.created},
          {"model", shape.model},
          {"choices", json::array({choice})}};
}

// Submits the request and serves it: a JSON body, or an SSE stream. The HTTP thread waits for the
// first token (or the failure) before answering, so a request the engine refuses gets a proper
// status instead of a stream with an error in it.
void run_generation(RouteContext& ctx, Response& res, const ResponseShape& shape,
                    const GenerationRequest& gen, std::vector<int32_t> prompt,
                    std::unique_ptr<OutputShaper> shaper) {
  const ModelInfo& info = ctx.loop.info();
  const RequestParams params = plan_request(gen, prompt, info, ctx.options.default_max_tokens);
  auto channel = std::make_shared<RequestChannel>();
  const int prompt_tokens = int(prompt.size());
  Submission submission{std::move(prompt), params, channel, Clock::now()};
  if (!ctx.loop.submit(std::move(submission))) {
    throw ApiError(429,
                   fmt::format("the server is full: {} requests running or queued (at most {} "
                               "running and {} queued); retry later",
                               ctx.loop.in_flight(), info.max_running, ctx.options.max_queue),
                   "", "queue_full");
  }
  auto job = std::make_shared<GenerationJob>(ctx.loop, channel, std::move(shaper), *info.tokenizer,
                                             gen, prompt_tokens);
  res.set_header("X-Request-Id", shape.id);

  auto pending = std::make_shared<std::vector<json>>();
  while (!job->advance(*pending, kWaitSlice) && job->completion_tokens() == 0) {
  }
  if (job->error() && job->completion_tokens() == 0) throw *job->error();

  if (!gen.stream) {
    while (!job->advance(*pending, kWaitSlice)) {
    }
    if (job->error()) throw *job->error();
    auto [key, value] = job->shaper().whole();
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", job->finish_reason()}};
    choice[key] = value;
    if (gen.return_token_ids) choice["token_ids"] = job->token_ids();
    send_json(res, 200,
              {{"id", shape.id},
               {"object", shape.object},
               {"created", shape.created},
               {"model", shape.model},
               {"choices", json::array({choice})},
               {"usage", job->usage()}});
    return;
  }

  auto opened = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, pending, opened, shape, gen](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!*opened) {
          *opened = true;
          const json opening = job->shaper().opening();
          if (!opening.is_null()) out += sse(choice_chunk(shape, opening, nullptr));
        }
        if (pending->empty() && !job->ended()) job->advance(*pending, kWaitSlice);
        for (const json& delta : *pending) out += sse(choice_chunk(shape, delta, nullptr));
        pending->clear();
        const bool end = job->ended();
        if (end) {
          if (job->error()) {
            out += sse(job->error()->body());
          } else {
            json last =
                choice_chunk(shape, shape.chat ? json::object() : json(), job->finish_reason());
            if (gen.return_token_ids) last["choices"][0]["token_ids"] = job->token_ids();
            out += sse(last);
            if (gen.include_usage) {
              json usage = choice_chunk(shape, json(), nullptr);
              usage["choices"] = json::array();
              usage["usage"] = job->usage();
              out += sse(usage);
            }
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          job->abandon();  // the client is gone: the engine aborts it before its next step
          return false;
        }
        if (end) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->abandon();
      });
}

void handle_completions(RouteContext& ctx, const Request& req, Response& res) {
  check_auth(ctx, req);
  const ModelInfo& info = ready_model(ctx);
  const json body = parse_body(req.body);
  check_model(body, ctx.options.served_model_name);
  const CompletionRequest r = parse_completion_request(body);
  std::vector<int32_t> prompt = r.prompt_text
                                    ? encode_text(*info.tokenizer, *r.prompt_text, true)
                                    : checked_ids(r.prompt_ids, info.vocab_size, "prompt");
  const ResponseShape shape{ctx.ids.next("cmpl-"),         "text_completion", "text_completion",
                            ctx.options.served_model_name, unix_now(),        false};
  run_generation(ctx, res, shape, r.gen, std::move(prompt), std::make_unique<TextShaper>());
}

void handle_chat(RouteContext& ctx, const Request& req, Response& res) {
  check_auth(ctx, req);
  const ModelInfo& info = ready_model(ctx);
  const json body = parse_body(req.body);
  check_model(body, ctx.options.served_model_name);
  const ChatRequest r = parse_chat_request(body);
  ChatPrompt prompt = render_chat_prompt(*info.tokenizer, req.body, r);
  const ResponseShape shape{
      ctx.ids.next("chatcmpl-"),     "chat.completion", "chat.completion.chunk",
      ctx.options.served_model_name, unix_now(),        true};
  run_generation(ctx, res, shape, r.gen, std::move(prompt.ids),
                 make_chat_shaper(r, prompt, ctx.ids));
}

void handle_tokenize(RouteContext& ctx, const Request& req, Response& res) {
  check_auth(ctx, req);
  const ModelInfo& info = ready_model(ctx);
  const json body = parse_body(req.body);
  check_model(body, ctx.options.served_model_name);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    ids = render_chat_prompt(*info.tokenizer, req.body, parse_chat_request(body)).ids;
  } else {
    const auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string()) {
      throw bad_request("prompt", "must be a string (or send messages)");
    }
    const auto special = body.find("add_special_tokens");
    if (special != body.end() && !special->is_boolean()) {
      throw bad_request("add_special_tokens", "must be a boolean");
    }
    const bool bos = special == body.end() || special->get<bool>();
    ids = encode_text(*info.tokenizer, prompt->get<std::string>(), bos);
  }
  send_json(res, 200,
            {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", info.max_context}});
}

void handle_detokenize(RouteContext& ctx, const Request& req, Response& res) {
  check_auth(ctx, req);
  const ModelInfo& info = ready_model(ctx);
  const json body = parse_body(req.body);
  check_model(body, ctx.options.served_model_name);
  const auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    throw bad_request("tokens", "must be an array of token ids");
  }
  std::vector<int64_t> raw;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX)) {
      throw bad_request("tokens", "token {} must be an integer id, got {}", i, t.dump());
    }
    raw.push_back(t.get<int64_t>());
  }
  const std::vector<int32_t> ids = checked_ids(raw, info.tokenizer->vocab_size(), "tokens");
  send_json(res, 200, {{"prompt", info.tokenizer->decode(ids)}});
}

}  // namespace

void install_routes(httplib::Server& http, RouteContext& ctx) {
  http.Get("/health", [&ctx](const Request& req, Response& res) {
    guarded(req, res, [&] {
      ready_model(ctx);
      send_json(res, 200, {{"status", "ok"}});
    });
  });
  http.Get("/metrics", [&ctx](const Request&, Response& res) {
    res.set_content(ctx.metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [&ctx](const Request& req, Response& res) {
    guarded(req, res, [&] {
      check_auth(ctx, req);
      json model = {{"id", ctx.options.served_model_name},
                    {"object", "model"},
                    {"created", ctx.created},
                    {"owned_by", "dsa"}};
      if (ctx.loop.ready()) model["max_model_len"] = ctx.loop.info().max_context;
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
  });
  auto post = [&](const char* path, void (*fn)(RouteContext&, const Request&, Response&)) {
    http.Post(path, [&ctx, fn](const Request& req, Response& res) {
      guarded(req, res, [&] { fn(ctx, req, res); });
    });
  };
  post("/v1/completions", handle_completions);
  post("/v1/chat/completions", handle_chat);
  post("/tokenize", handle_tokenize);
  post("/detokenize", handle_detokenize);
}

}  // namespace dsa::server
