// ChatRequest -> prompt text, following DeepSeek's encoders rule by rule:
//   V3.2: each user turn is "<｜User｜>…<｜Assistant｜>" + "<think>" (last user turn, thinking)
//         or "</think>"; tool results follow the calling assistant turn as one
//         <function_results> block; reasoning is rendered only after the last user turn.
//   V4:   tool results are folded into a user turn as <tool_result> blocks (sorted into call
//         order); "<｜Assistant｜>" + think token is added after a user/developer turn that the
//         assistant answers; earlier reasoning is dropped unless tools are present or
//         drop_thinking is off.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "dsa/error.h"
#include "dsa/text/chat.h"
#include "text/chat_format.h"
#include "text/py_json.h"

namespace dsa::text {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

bool is_user_like(Role r) { return r == Role::kUser || r == Role::kDeveloper; }

std::string response_format_block(const Json& rf) {
  return std::string(kResponseFormatHead) + py_json(rf);
}

// One call's parameters: string values raw, everything else as JSON text.
std::string render_parameters(const ChatToolCall& call, ChatFormat format, size_t msg, size_t k) {
  Json args = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded()) {
    // V4 keeps unparsable arguments as one string parameter named "arguments"; V3.2 refuses.
    require(format == ChatFormat::kV4, ErrorCode::kInvalidArgument,
            "messages[{}].tool_calls[{}].function.arguments is not valid JSON: {:.80}", msg, k,
            call.arguments);
    args = Json::object({{"arguments", call.arguments}});
  }
  require(args.is_object(), ErrorCode::kInvalidArgument,
          "messages[{}].tool_calls[{}].function.arguments must be a JSON object, got {}", msg, k,
          args.type_name());
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    const bool is_string = value.is_string();
    out += fmt::format("<{}parameter name=\"{}\" string=\"{}\">", kDsml, key,
                       is_string ? "true" : "false");
    if (is_string)
      out += value.get_ref<const std::string&>();
    else
      append_py_json(out, value);
    out += fmt::format("</{}parameter>", kDsml);
  }
  return out;
}

// The text between the end of reasoning and the end-of-sentence token of an assistant turn.
std::string assistant_body(const ChatMessage& m, ChatFormat format, size_t index) {
  if (m.raw) return *m.raw;
  std::string out = m.content.value_or("");
  if (!m.tool_calls.empty()) out += render_tool_calls(m.tool_calls, format, index);
  return out;
}

std::string system_text(const ChatMessage& m, ChatFormat format) {
  std::string out = m.content.value_or("");
  if (!m.tools.empty()) out += "\n\n" + render_tools_block(m.tools, format);
  if (m.response_format) out += "\n\n" + response_format_block(*m.response_format);
  return out;
}

// ---- V3.2 ----

std::string render_v32(const ChatRequest& req) {
  // Drop-thinking removes developer turns before the last user turn; the official encoder
  // removes them too (and then fails on its own index arithmetic: we render the rest).
  std::vector<const ChatMessage*> msgs;
  std::vector<size_t> source;  // index into req.messages, for error messages
  {
    int last_user = -1;
    for (size_t i = 0; i < req.messages.size(); ++i) {
      if (is_user_like(req.messages[i].role)) last_user = int(i);
    }
    for (size_t i = 0; i < req.messages.size(); ++i) {
      const ChatMessage& m = req.messages[i];
      require(m.role != Role::kLatestReminder, ErrorCode::kInvalidArgument,
              "messages[{}].role: 'latest_reminder' exists only in the v4 chat format", i);
      if (req.thinking && req.drop_thinking && m.role == Role::kDeveloper && int(i) < last_user) {
        continue;
      }
      msgs.push_back(&m);
      source.push_back(i);
    }
  }
  int last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (is_user_like(msgs[i]->role)) last_user = int(i);
  }
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = *msgs[i];
    const bool opens_thinking = req.thinking && int(i) == last_user;
    switch (m.role) {
      case Role::kSystem:
        out += system_text(m, ChatFormat::kV32);
        break;
      case Role::kDeveloper: {
        out += kUserToken;
        if (!m.tools.empty()) out += "\n\n" + render_tools_block(m.tools, ChatFormat::kV32);
        if (m.response_format) out += "\n\n" + response_format_block(*m.response_format);
        out += "\n\n# The user's message is: " + *m.content;
        out += kAssistantToken;
        out += think_token(opens_thinking);
        break;
      }
      case Role::kUser:
        out += kUserToken;
        out += *m.content;
        out += kAssistantToken;
        out += think_token(opens_thinking);
        break;
      case Role::kTool: {
        size_t caller = i;
        while (caller > 0 && msgs[caller - 1]->role == Role::kTool) --caller;
        require(caller > 0 && msgs[caller - 1]->role == Role::kAssistant,
                ErrorCode::kInvalidArgument,
                "messages[{}]: a tool result must follow an assistant message with tool_calls",
                source[i]);
        const ChatMessage& assistant = *msgs[caller - 1];
        const size_t order = i - caller + 1;  // 1-based position among the results
        const size_t n_calls = assistant.tool_calls.size();
        require(order <= n_calls, ErrorCode::kInvalidArgument,
                "messages[{}]: tool result {} of an assistant message with {} tool call(s)",
                source[i], order, n_calls);
        const bool last_result = i + 1 == msgs.size() || msgs[i + 1]->role != Role::kTool;
        require(!last_result || order == n_calls, ErrorCode::kInvalidArgument,
                "messages[{}]: only {} tool result(s) follow an assistant message with {} tool "
                "call(s)",
                source[i], order, n_calls);
        if (order == 1) out += "\n\n<function_results>";
        out += "\n<result>" + *m.content + "</result>";
        if (order == n_calls) {
          out += "\n</function_results>\n\n";
          out += think_token(req.thinking && int(i) >= last_user);
        }
        break;
      }
      case Role::kAssistant: {
        if (req.thinking && int(i) > last_user) {
          require(m.raw || m.reasoning_content.value_or("") != "" || !m.tool_calls.empty(),
                  ErrorCode::kInvalidArgument,
                  "messages[{}]: in thinking mode an assistant message after the last user "
                  "message needs reasoning_content or tool_calls",
                  source[i]);
          out += m.reasoning_content.value_or("");
          out += kThinkClose;
        }
        out += assistant_body(m, ChatFormat::kV32, source[i]);
        out += kEos;
        break;
      }
      case Role::kLatestReminder:
        break;  // refused above
    }
  }
  return out;
}

// ---- V4 ----

struct Block {
  bool tool_result = false;
  std::string text;         // the text, or the tool result's content
  std::string tool_use_id;  // tool results only
};

// A message after V4's preprocessing: tool results and user text merged into user turns.
struct V4Message {
  const ChatMessage* msg = nullptr;  // the source (for non-user roles, and a user's options)
  Role role = Role::kUser;
  std::vector<Block> blocks;  // user turns
  std::optional<std::string> task;
};

std::vector<V4Message> merge_tool_results(const ChatRequest& req) {
  std::vector<V4Message> out;
  auto merges_into_last = [&](bool needs_no_task) {
    return !out.empty() && out.back().role == Role::kUser && !out.back().blocks.empty() &&
           (!needs_no_task || !out.back().task);
  };
  for (const ChatMessage& m : req.messages) {
    if (m.role == Role::kTool) {
      Block b{true, *m.content, m.tool_call_id};
      if (merges_into_last(false)) {
        out.back().blocks.push_back(std::move(b));
      } else {
        V4Message u;
        u.role = Role::kUser;
        u.blocks.push_back(std::move(b));
        out.push_back(std::move(u));
      }
    } else if (m.role == Role::kUser) {
      Block b{false, *m.content, {}};
      if (merges_into_last(true)) {
        out.back().blocks.push_back(std::move(b));
      } else {
        V4Message u;
        u.msg = &m;
        u.role = Role::kUser;
        u.task = m.task;
        u.blocks.push_back(std::move(b));
        out.push_back(std::move(u));
      }
    } else {
      V4Message v;
      v.msg = &m;
      v.role = m.role;
      v.task = m.task;
      out.push_back(std::move(v));
    }
  }
  return out;
}

// Tool results of one user turn are put into the order of the calls that asked for them.
void sort_tool_results(std::vector<V4Message>& msgs) {
  std::unordered_map<std::string, size_t> call_order;
  for (V4Message& v : msgs) {
    if (v.role == Role::kAssistant && !v.msg->tool_calls.empty()) {
      call_order.clear();
      for (size_t k = 0; k < v.msg->tool_calls.size(); ++k) {
        const std::string& id = v.msg->tool_calls[k].id;
        if (!id.empty()) call_order[id] = k;
      }
    } else if (v.role == Role::kUser && !call_order.empty()) {
      std::vector<Block> results;
      for (const Block& b : v.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() < 2) continue;
      auto rank = [&](const Block& b) {
        const auto it = call_order.find(b.tool_use_id);
        return it == call_order.end() ? size_t(0) : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : v.blocks) {
        if (b.tool_result) b = results[next++];
      }
    }
  }
}

std::string render_v4(const ChatRequest& req) {
  std::vector<V4Message> msgs = merge_tool_results(req);
  sort_tool_results(msgs);
  bool drop = req.drop_thinking;
  for (const V4Message& v : msgs) {
    if (v.msg && !v.msg->tools.empty()) drop = false;  // tools keep every turn's reasoning
  }
  auto last_user_index = [&] {
    int last = -1;
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (is_user_like(msgs[i].role)) last = int(i);
    }
    return last;
  };
  if (req.thinking && drop) {
    const int last = last_user_index();
    std::vector<V4Message> kept;
    for (size_t i = 0; i < msgs.size(); ++i) {
      V4Message& v = msgs[i];
      if (int(i) >= last || v.role == Role::kUser || v.role == Role::kSystem ||
          v.role == Role::kLatestReminder) {
        kept.push_back(std::move(v));
      } else if (v.role == Role::kAssistant) {
        kept.push_back(std::move(v));  // its reasoning is not rendered (i < last user turn)
      }                                // developer turns before the last user turn are dropped
    }
    msgs = std::move(kept);
  }
  const int last_user = last_user_index();
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const V4Message& v = msgs[i];
    if (i == 0 && req.thinking && req.reasoning_effort == ReasoningEffort::kMax) {
      out += kReasoningEffortMax;
    }
    switch (v.role) {
      case Role::kSystem:
        out += system_text(*v.msg, ChatFormat::kV4);
        break;
      case Role::kDeveloper:
        out += kUserToken;
        out += *v.msg->content;
        if (!v.msg->tools.empty())
          out += "\n\n" + render_tools_block(v.msg->tools, ChatFormat::kV4);
        if (v.msg->response_format) out += "\n\n" + response_format_block(*v.msg->response_format);
        break;
      case Role::kUser:
        out += kUserToken;
        for (size_t k = 0; k < v.blocks.size(); ++k) {
          if (k > 0) out += "\n\n";
          const Block& b = v.blocks[k];
          out += b.tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
        }
        break;
      case Role::kLatestReminder:
        out += kLatestReminderToken;
        out += *v.msg->content;
        break;
      case Role::kAssistant: {
        const ChatMessage& m = *v.msg;
        const bool after_task = i > 0 && msgs[i - 1].task.has_value();
        if (req.thinking && !after_task && (!drop || int(i) > last_user)) {
          out += m.reasoning_content.value_or("");
          out += kThinkClose;
        }
        out += assistant_body(m, ChatFormat::kV4, size_t(&m - req.messages.data()));
        if (!m.wo_eos) out += kEos;
        break;
      }
      case Role::kTool:
        break;  // merged into user turns above
    }
    // What follows decides the transition: only before an assistant turn (or at the end).
    if (i + 1 < msgs.size() && msgs[i + 1].role != Role::kAssistant &&
        msgs[i + 1].role != Role::kLatestReminder) {
      continue;
    }
    if (v.task) {
      const std::string token = fmt::format("<｜{}｜>", *v.task);
      if (*v.task == "action") {
        out += kAssistantToken;
        out += think_token(req.thinking);
      }
      out += token;
    } else if (is_user_like(v.role)) {
      out += kAssistantToken;
      out += think_token(req.thinking && (!drop || int(i) >= last_user));
    }
  }
  return out;
}

}  // namespace

std::string render_tool_calls(const std::vector<ChatToolCall>& calls, ChatFormat format,
                              size_t message_index) {
  const std::string_view block = chat_format_spec(format).calls_block;
  std::string out = fmt::format("\n\n<{}{}>\n", kDsml, block);
  for (size_t k = 0; k < calls.size(); ++k) {
    if (k > 0) out += '\n';
    out += fmt::format("<{}invoke name=\"{}\">\n", kDsml, calls[k].name);
    out += render_parameters(calls[k], format, message_index, k);
    out += fmt::format("\n</{}invoke>", kDsml);
  }
  out += fmt::format("\n</{}{}>", kDsml, block);
  return out;
}

std::string render_chat(const ChatRequest& request, ChatFormat format, bool add_bos) {
  std::string out = add_bos ? std::string(kBos) : std::string();
  out += format == ChatFormat::kV32 ? render_v32(request) : render_v4(request);
  return out;
}

}  // namespace dsa::text
