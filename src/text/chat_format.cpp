// The tools preambles are part of the prompt format: the model was trained on these exact bytes.
#include "text/chat_format.h"

#include "text/py_json.h"

namespace dsa::text {
namespace {

constexpr std::string_view kV32ToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following "
    "as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n"
    "\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    "while lists and objects should use JSON format. The \"string\" attribute should be set to "
    "\"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
    "arrays, objects).\n"
    "\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n"
    "\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n"
    "\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "\n"
    "<think>...thinking about results</think>\n"
    "\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kV32ToolsTail = "\n</functions>\n";

constexpr std::string_view kV4ToolsHead =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";
constexpr std::string_view kV4ToolsTail =
    "\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n";

constexpr ChatFormatSpec kV32{ChatFormat::kV32, "function_calls", kV32ToolsHead, kV32ToolsTail};
constexpr ChatFormatSpec kV4{ChatFormat::kV4, "tool_calls", kV4ToolsHead, kV4ToolsTail};

}  // namespace

const ChatFormatSpec& chat_format_spec(ChatFormat format) {
  return format == ChatFormat::kV32 ? kV32 : kV4;
}

std::string render_tools_block(const std::vector<nlohmann::ordered_json>& tools,
                               ChatFormat format) {
  const ChatFormatSpec& spec = chat_format_spec(format);
  std::string out(spec.tools_head);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i > 0) out += '\n';
    append_py_json(out, tools[i]);
  }
  out += spec.tools_tail;
  return out;
}

}  // namespace dsa::text
