// OpenAI-style chat request -> validated ChatRequest. Every rejection names the field.
#include <fmt/format.h>

#include <algorithm>

#include "dsa/error.h"
#include "dsa/text/chat.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;

std::string_view type_name(const Json& j) { return j.type_name(); }

// content: a string, null/absent, or a list of {"type": "text", "text": S} parts.
std::optional<std::string> content_text(const Json& msg, const std::string& where) {
  const auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  require(it->is_array(), ErrorCode::kInvalidArgument,
          "{}.content must be a string, null or a list of text parts, got {}", where,
          type_name(*it));
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& part = (*it)[i];
    const std::string field = fmt::format("{}.content[{}]", where, i);
    require(part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
                part["text"].is_string(),
            ErrorCode::kInvalidArgument,
            "{} must be {{\"type\": \"text\", \"text\": string}}; only text parts are supported",
            field);
    if (i > 0) text += "\n\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

std::optional<std::string> optional_string(const Json& msg, const char* key,
                                           const std::string& where) {
  const auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return std::nullopt;
  require(it->is_string(), ErrorCode::kInvalidArgument, "{}.{} must be a string, got {}", where,
          key, type_name(*it));
  return it->get<std::string>();
}

Role parse_role(const Json& msg, const std::string& where) {
  require(msg.contains("role") && msg["role"].is_string(), ErrorCode::kInvalidArgument,
          "{}.role is missing or not a string", where);
  const auto& r = msg["role"].get_ref<const std::string&>();
  if (r == "system") return Role::kSystem;
  if (r == "developer") return Role::kDeveloper;
  if (r == "user") return Role::kUser;
  if (r == "assistant") return Role::kAssistant;
  if (r == "tool") return Role::kTool;
  if (r == "latest_reminder") return Role::kLatestReminder;
  fail(ErrorCode::kInvalidArgument,
       "{}.role: unknown role '{}' (expected system, developer, user, assistant, tool or "
       "latest_reminder)",
       where, r);
}

// One entry of "tools": {"type": "function", "function": {"name": S, "parameters": {...}, ...}}.
Json parse_tool(const Json& tool, const std::string& where) {
  require(tool.is_object(), ErrorCode::kInvalidArgument, "{} must be an object, got {}", where,
          type_name(tool));
  if (tool.contains("type")) {
    require(tool["type"] == "function", ErrorCode::kInvalidArgument,
            "{}.type must be \"function\", got {}", where, tool["type"].dump());
  }
  require(tool.contains("function") && tool["function"].is_object(), ErrorCode::kInvalidArgument,
          "{}.function must be an object", where);
  const Json& fn = tool["function"];
  require(fn.contains("name") && fn["name"].is_string() && !fn["name"].get<std::string>().empty(),
          ErrorCode::kInvalidArgument, "{}.function.name must be a non-empty string", where);
  if (fn.contains("parameters")) {
    require(fn["parameters"].is_object(), ErrorCode::kInvalidArgument,
            "{}.function.parameters must be a JSON schema object, got {}", where,
            type_name(fn["parameters"]));
  }
  if (fn.contains("description")) {
    require(fn["description"].is_string(), ErrorCode::kInvalidArgument,
            "{}.function.description must be a string", where);
  }
  return fn;
}

std::vector<Json> parse_tools(const Json& tools, const std::string& where) {
  require(tools.is_array(), ErrorCode::kInvalidArgument, "{} must be a list, got {}", where,
          type_name(tools));
  std::vector<Json> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    out.push_back(parse_tool(tools[i], fmt::format("{}[{}]", where, i)));
  }
  return out;
}

ChatToolCall parse_tool_call(const Json& call, const std::string& where) {
  require(call.is_object(), ErrorCode::kInvalidArgument, "{} must be an object", where);
  ChatToolCall out;
  if (call.contains("id") && !call["id"].is_null()) {
    require(call["id"].is_string(), ErrorCode::kInvalidArgument, "{}.id must be a string", where);
    out.id = call["id"].get<std::string>();
  }
  require(call.contains("function") && call["function"].is_object(), ErrorCode::kInvalidArgument,
          "{}.function must be an object", where);
  const Json& fn = call["function"];
  require(fn.contains("name") && fn["name"].is_string(), ErrorCode::kInvalidArgument,
          "{}.function.name must be a string", where);
  out.name = fn["name"].get<std::string>();
  const auto args = fn.find("arguments");
  if (args == fn.end() || args->is_null()) {
    out.arguments = "{}";
  } else if (args->is_string()) {
    out.arguments = args->get<std::string>();
  } else {
    require(args->is_object(), ErrorCode::kInvalidArgument,
            "{}.function.arguments must be a JSON object text, got {}", where, type_name(*args));
    out.arguments = args->dump();
  }
  return out;
}

ChatMessage parse_message(const Json& msg, const std::string& where) {
  require(msg.is_object(), ErrorCode::kInvalidArgument, "{} must be an object, got {}", where,
          type_name(msg));
  ChatMessage m;
  m.role = parse_role(msg, where);
  m.content = content_text(msg, where);
  m.reasoning_content = optional_string(msg, "reasoning_content", where);
  if (!m.reasoning_content) m.reasoning_content = optional_string(msg, "reasoning", where);
  switch (m.role) {
    case Role::kUser:
    case Role::kTool:
      require(m.content.has_value(), ErrorCode::kInvalidArgument,
              "{}.content is required for role '{}'", where, role_name(m.role));
      break;
    case Role::kDeveloper:
    case Role::kLatestReminder:
      require(m.content.has_value() && !m.content->empty(), ErrorCode::kInvalidArgument,
              "{}.content must be a non-empty string for role '{}'", where, role_name(m.role));
      break;
    default:
      break;
  }
  if (m.role == Role::kTool) {
    if (auto id = optional_string(msg, "tool_call_id", where)) m.tool_call_id = *id;
  }
  if (const auto it = msg.find("tool_calls"); it != msg.end() && !it->is_null()) {
    require(m.role == Role::kAssistant, ErrorCode::kInvalidArgument,
            "{}.tool_calls is only allowed on assistant messages", where);
    require(it->is_array(), ErrorCode::kInvalidArgument, "{}.tool_calls must be a list", where);
    for (size_t i = 0; i < it->size(); ++i) {
      m.tool_calls.push_back(parse_tool_call((*it)[i], fmt::format("{}.tool_calls[{}]", where, i)));
    }
  }
  if (const auto it = msg.find("tools"); it != msg.end() && !it->is_null()) {
    require(m.role == Role::kSystem || m.role == Role::kDeveloper, ErrorCode::kInvalidArgument,
            "{}.tools is only allowed on system and developer messages", where);
    m.tools = parse_tools(*it, where + ".tools");
  }
  if (const auto it = msg.find("response_format"); it != msg.end() && !it->is_null()) {
    require(m.role == Role::kSystem || m.role == Role::kDeveloper, ErrorCode::kInvalidArgument,
            "{}.response_format is only allowed on system and developer messages", where);
    m.response_format = *it;
  }
  m.raw = optional_string(msg, kRawCompletionKey.data(), where);
  require(!m.raw || m.role == Role::kAssistant, ErrorCode::kInvalidArgument,
          "{}.{} is only allowed on assistant messages", where, kRawCompletionKey);
  m.task = optional_string(msg, "task", where);
  if (m.task) {
    static constexpr std::string_view kTasks[] = {"action", "query", "authority",
                                                  "domain", "title", "read_url"};
    require(std::find(std::begin(kTasks), std::end(kTasks), *m.task) != std::end(kTasks),
            ErrorCode::kInvalidArgument,
            "{}.task: unknown task '{}' (expected action, query, authority, domain, title or "
            "read_url)",
            where, *m.task);
  }
  if (const auto it = msg.find("wo_eos"); it != msg.end()) {
    require(it->is_boolean(), ErrorCode::kInvalidArgument, "{}.wo_eos must be a boolean", where);
    m.wo_eos = it->get<bool>();
  }
  return m;
}

// "thinking": true/false or {"type": "enabled"|"disabled"}.
bool parse_thinking_value(const Json& v, const std::string& where) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_object() && v.contains("type") && v["type"].is_string()) {
    const auto& t = v["type"].get_ref<const std::string&>();
    if (t == "enabled") return true;
    if (t == "disabled") return false;
  }
  fail(ErrorCode::kInvalidArgument,
       "{} must be true, false or {{\"type\": \"enabled\"|\"disabled\"}}, got {}", where, v.dump());
}

}  // namespace

ChatRequest parse_chat_request(const Json& body) {
  require(body.is_object(), ErrorCode::kInvalidArgument,
          "the chat request must be a JSON object, got {}", type_name(body));
  require(body.contains("messages") && body["messages"].is_array(), ErrorCode::kInvalidArgument,
          "messages must be a list of message objects");
  const Json& messages = body["messages"];
  require(!messages.empty(), ErrorCode::kInvalidArgument, "messages must not be empty");
  ChatRequest req;
  for (size_t i = 0; i < messages.size(); ++i) {
    req.messages.push_back(parse_message(messages[i], fmt::format("messages[{}]", i)));
  }
  for (const auto& m : req.messages) req.has_tools = req.has_tools || !m.tools.empty();
  if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    std::vector<Json> tools = parse_tools(*it, "tools");
    if (!tools.empty()) {
      req.has_tools = true;
      auto& head = req.messages.front();
      if (head.role == Role::kSystem || head.role == Role::kDeveloper) {
        head.tools = std::move(tools);
      } else {
        ChatMessage system;
        system.role = Role::kSystem;
        system.tools = std::move(tools);
        req.messages.insert(req.messages.begin(), std::move(system));
      }
    }
  }
  if (const auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
    req.thinking = parse_thinking_value(*it, "thinking");
  }
  if (const auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    require(it->is_object(), ErrorCode::kInvalidArgument,
            "chat_template_kwargs must be an object, got {}", type_name(*it));
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (it->contains(key)) {
        req.thinking =
            parse_thinking_value((*it)[key], fmt::format("chat_template_kwargs.{}", key));
      }
    }
    if (it->contains("drop_thinking")) {
      require((*it)["drop_thinking"].is_boolean(), ErrorCode::kInvalidArgument,
              "chat_template_kwargs.drop_thinking must be a boolean");
      req.drop_thinking = (*it)["drop_thinking"].get<bool>();
    }
  }
  if (const auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    require(it->is_string(), ErrorCode::kInvalidArgument, "reasoning_effort must be a string");
    const auto& e = it->get_ref<const std::string&>();
    if (e == "none") {
      req.thinking = false;
    } else if (e == "max") {
      req.reasoning_effort = ReasoningEffort::kMax;
    } else if (e == "high") {
      req.reasoning_effort = ReasoningEffort::kHigh;
    } else {
      require(e == "low" || e == "medium" || e == "minimal", ErrorCode::kInvalidArgument,
              "reasoning_effort: unknown value '{}' (expected none, minimal, low, medium, high "
              "or max)",
              e);
    }
  }
  return req;
}

ChatRequest parse_chat_request(std::string_view body) {
  Json parsed;
  try {
    parsed = Json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorCode::kInvalidArgument, "the chat request is not valid JSON: {}", e.what());
  }
  return parse_chat_request(parsed);
}

ChatFormat parse_chat_format(std::string_view name) {
  if (name == "v32" || name == "v3.2") return ChatFormat::kV32;
  if (name == "v4") return ChatFormat::kV4;
  fail(ErrorCode::kInvalidArgument, "unknown chat format '{}' (expected v32 or v4)", name);
}

std::string_view chat_format_name(ChatFormat format) {
  return format == ChatFormat::kV32 ? "v32" : "v4";
}

std::string_view role_name(Role role) {
  switch (role) {
    case Role::kSystem:
      return "system";
    case Role::kDeveloper:
      return "developer";
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "tool";
    case Role::kLatestReminder:
      return "latest_reminder";
  }
  return "?";
}

}  // namespace dsa::text
