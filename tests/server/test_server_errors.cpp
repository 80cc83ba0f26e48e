// Every error row of the server with its status and error.type, and a table of more than a
// hundred malformed bodies: each gets a 4xx with an OpenAI error body, and the server stays up.
#include "server_fixture.h"

namespace dsa::server::testing {
namespace {

class ServerErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions o;
    o.max_body_bytes = 1 << 20;
    server_ = new TestServer(o);
    ASSERT_TRUE(server_->wait_ready());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};
TestServer* ServerErrors::server_ = nullptr;

struct Row {
  std::string name;
  std::string method, path, body;
  int status;
  std::string type;
  std::string message_has;  // a substring of error.message ("" : any)
};

TEST_F(ServerErrors, EveryErrorRowHasItsStatusAndType) {
  const std::string long_prompt(2000, 'x');  // tokenizes past the 512-token context
  const std::vector<Row> rows = {
      {"invalid json", "POST", "/v1/completions", "{\"prompt\": ", 400, "invalid_request_error",
       "not valid JSON"},
      {"wrong type", "POST", "/v1/completions", R"({"prompt": "a", "max_tokens": "9"})", 400,
       "invalid_request_error", "'max_tokens' must be an integer"},
      {"over context", "POST", "/v1/completions",
       json{{"prompt", long_prompt}, {"max_tokens", 4}}.dump(), 400, "invalid_request_error",
       "context holds 512"},
      {"prompt plus max_tokens over context", "POST", "/v1/completions",
       R"({"prompt": [1, 2, 3], "max_tokens": 510})", 400, "invalid_request_error",
       "the prompt has 3 tokens and max_tokens is 510: 513 tokens, but the model's context holds "
       "512"},
      {"unknown model", "POST", "/v1/completions", R"({"model": "gpt-9", "prompt": "a"})", 404,
       "not_found_error", "gpt-9"},
      {"unknown route", "GET", "/v1/engines", "", 404, "not_found_error", "/v1/engines"},
      {"unknown post route", "POST", "/v2/completions", "{}", 404, "not_found_error", ""},
      {"n = 2", "POST", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "a"}], "n": 2})", 400, "invalid_request_error",
       "'n' must be 1"},
      {"token outside the vocabulary", "POST", "/v1/completions",
       R"({"prompt": [1, 5000], "max_tokens": 2})", 400, "invalid_request_error",
       "outside the vocabulary [0, 1024)"},
      {"body too large", "POST", "/v1/completions",
       json{{"prompt", std::string(2 << 20, 'a')}}.dump(), 413, "request_too_large", ""},
  };
  for (const Row& row : rows) {
    httplib::Client c = server_->client();
    auto r = row.method == "GET" ? c.Get(row.path.c_str())
                                 : c.Post(row.path.c_str(), row.body, "application/json");
    ASSERT_TRUE(r) << row.name << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, row.status) << row.name << ": " << r->body;
    const json body = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << row.name << ": " << r->body;
    EXPECT_EQ(body["error"]["type"], row.type) << row.name;
    EXPECT_TRUE(body["error"].contains("param") && body["error"].contains("code")) << row.name;
    EXPECT_NE(body["error"]["message"].get<std::string>().find(row.message_has), std::string::npos)
        << row.name << ": " << body["error"]["message"];
  }
}

// Bodies that must all be refused with a 4xx.
std::vector<std::pair<std::string, std::string>> malformed_bodies() {
  std::vector<std::pair<std::string, std::string>> b;  // (path, body)
  const std::string c = "/v1/completions", chat = "/v1/chat/completions";
  const std::string valid_chat = R"({"messages": [{"role": "user", "content": "hi"}]})";
  // Truncated JSON: every proper prefix of a valid body.
  for (size_t n = 0; n < valid_chat.size(); n += 3) b.push_back({chat, valid_chat.substr(0, n)});
  // Not an object.
  for (const char* s : {"[]", "1", "\"x\"", "null", "true", "[{\"prompt\": \"a\"}]"}) {
    b.push_back({c, s});
    b.push_back({chat, s});
  }
  // Wrong types and values of the generation fields.
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"max_tokens", "\"5\""},
      {"max_tokens", "-1"},
      {"max_tokens", "0"},
      {"max_tokens", "1.5"},
      {"max_tokens", "1e300"},
      {"max_tokens", "99999999999999999999"},
      {"max_tokens", "[]"},
      {"max_completion_tokens", "-7"},
      {"temperature", "\"hot\""},
      {"temperature", "-0.5"},
      {"temperature", "3"},
      {"temperature", "1e309"},
      {"top_p", "0"},
      {"top_p", "1.5"},
      {"top_p", "{}"},
      {"seed", "1.5"},
      {"seed", "\"s\""},
      {"n", "0"},
      {"n", "3"},
      {"n", "\"1\""},
      {"stop", "5"},
      {"stop", "[1]"},
      {"stop", "[\"a\",\"b\",\"c\",\"d\",\"e\"]"},
      {"stop", "[\"\"]"},
      {"stream", "\"yes\""},
      {"stream", "1"},
      {"stream_options", "{\"include_usage\": true}"},  // without stream
      {"stream_options", "[]"},
      {"ignore_eos", "0"},
      {"model", "5"},
      {"model", "\"other\""},
      {"return_token_ids", "\"no\""}};
  for (const auto& [field, value] : fields) {
    b.push_back({c, "{\"prompt\": \"a\", \"" + field + "\": " + value + "}"});
    b.push_back({chat, R"({"messages": [{"role": "user", "content": "hi"}], ")" + field +
                           "\": " + value + "}"});
  }
  // Prompts.
  for (const char* p : {"null", "\"\"", "[]", "5", "{}", "[1.5]", "[-1]", "[\"a\", \"b\"]",
                        "[[1], [2]]", "[true]", "[99999999999999]", "[1, \"a\"]"}) {
    b.push_back({c, std::string("{\"prompt\": ") + p + "}"});
  }
  b.push_back({c, "{}"});
  // Messages.
  for (
      const char* m :
      {"null", "[]", "{}", "\"hi\"", "[1]", "[{}]", R"([{"role": "wizard", "content": "x"}])",
       R"([{"role": 5, "content": "x"}])", R"([{"role": "user"}])",
       R"([{"role": "user", "content": 5}])",
       R"([{"role": "user", "content": [{"type": "image_url"}]}])",
       R"([{"role": "user", "content": [5]}])", R"([{"role": "tool", "content": "x"}])",
       R"([{"role": "assistant", "tool_calls": 5}])",
       R"([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}])",
       R"([{"role": "assistant", "tool_calls": [{"type": "function"}]}])"}) {
    b.push_back({chat, std::string("{\"messages\": ") + m + "}"});
  }
  // Tools and tool_choice.
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  for (
      const char* t :
      {R"("tools": 5)", R"("tools": {})", R"("tools": [5])", R"("tools": [{"type": "retrieval"}])",
       R"("tools": [{"type": "function"}])", R"("tools": [{"type": "function", "function": {}}])",
       R"("tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}])",
       R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}])",
       R"("tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}])",
       R"("tool_choice": "always")", R"("tool_choice": 5)", R"("tool_choice": "required")",
       R"("tool_choice": {"type": "function", "function": {"name": "g"}})",
       R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}})",
       R"("parallel_tool_calls": "yes")"}) {
    b.push_back({chat, "{" + user + ", " + t + "}"});
  }
  // Huge and broken strings.
  b.push_back({c, "{\"prompt\": \"" + std::string(10 << 20, 'a') + "\"}"});  // 10 MB: 413
  b.push_back({chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"" +
                         std::string(10 << 20, 'b') + "\"}]}"});
  for (const char* bad :
       {"\xff", "\xc3", "\xc3\x28", "\xe2\x82", "\xed\xa0\x80", "\xf8\x88\x80\x80\x80"}) {
    b.push_back({c, std::string("{\"prompt\": \"a") + bad + "\"}"});
    b.push_back(
        {chat, std::string(R"({"messages": [{"role": "user", "content": "a)") + bad + "\"}]}"});
  }
  b.push_back({c, "{\"prompt\": \"\\ud800\"}"});  // a lone surrogate escape
  b.push_back({c, "{\"prompt\": \"a\"} trailing"});
  b.push_back({c, "{\"prompt\": \"a\",}"});
  b.push_back({c, "{'prompt': 'a'}"});
  b.push_back({c, std::string("{\"prompt\": \"a\0b\"", 15) + "}"});
  b.push_back({c, "{\"prompt\": [" + std::string(100, '[') + "1" + std::string(100, ']') + "]}"});
  return b;
}

TEST_F(ServerErrors, MalformedBodiesGet4xxAndTheServerStaysUp) {
  const auto bodies = malformed_bodies();
  ASSERT_GE(bodies.size(), 100u);
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto& [path, body] = bodies[i];
    auto r = server_->post(path, body);
    ASSERT_TRUE(r) << "body " << i << " on " << path << ": no response ("
                   << httplib::to_string(r.error()) << ")";
    EXPECT_GE(r->status, 400) << "body " << i << ": " << body.substr(0, 200);
    EXPECT_LT(r->status, 500) << "body " << i << ": " << body.substr(0, 200) << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(!e.is_discarded() && e.contains("error") && e["error"].contains("type"))
        << "body " << i << ": " << r->body;
  }
  auto health = server_->client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto ok = server_->post("/v1/completions", json{{"prompt", "still here"}, {"max_tokens", 2}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

}  // namespace
}  // namespace dsa::server::testing
